"""Users and roles over REST, the routes of ns_server's user management
(https://docs.couchbase.com/server/current/rest-api/rbac.html; menelaus_web_rbac.erl in
https://github.com/couchbase/ns_server), which the SDKs' user managers (`cluster.users()`) call:

    GET    /settings/rbac/roles                      every role: role, its parameters, name, desc
    GET    /settings/rbac/users                      every user
    GET    /settings/rbac/users/<domain>             the users of a domain
    GET    /settings/rbac/users/<domain>/<name>      one user (404 "Unknown user.")
    PUT    /settings/rbac/users/local/<name>         make or change: form password, roles, name, groups
    DELETE /settings/rbac/users/local/<name>         drop (404 "Unknown user.")
    POST   /controller/changePassword                the user changes its own password: form password

Only an administrator may call them (ns_server's security permissions: 403 otherwise), but any
user may change its own password (the SDKs' `change_password`). A user is
ns_server's JSON: id, domain, roles (each with its bucket_name / scope_name / collection_name and
origins), groups, external_groups, name, password_change_date. Answers are ns_server's: 200 `""` for
a change, 400 {"errors": {field: message}} for invalid input - a password under 6 characters, a role
that is unknown or on a bucket that does not exist ("Cannot assign roles to user because the
following roles are unknown, malformed or role parameters are undefined: [...]"), a role on one
scope or collection (dcpflow grants roles per bucket); and what ns_server's community edition
answers for its enterprise features: groups 400 "User groups require enterprise edition", the
`external` domain (LDAP) 400 "This http API endpoint requires enterprise edition".

A change takes effect at once: the user database (server/auth.py) keeps it (across restarts, in the
data directory), and every open KV connection of the user gets a new privilege context
(Server.user_changed): changed roles apply to its next command, a dropped user's connections keep
no privilege (EACCESS), and its DCP streams end - what kv_engine does when ns_server pushes a new
RBAC database.
"""

import asyncio

from aiohttp import web

from ..audit import DELETE_USER, SET_USER
from ..auth import ROLES, hashed_user, make_user, parse_role
from .app import SERVER, USER, HTTPError, audit_change, errors, read_form, reply_json, require, unauthorized

routes = web.RouteTableDef()

_BUCKET = ("bucket_name",)
_COLLECTION = ("bucket_name", "scope_name", "collection_name")
#: role -> (its parameters, ns_server's name and description) (menelaus_roles.erl)
ROLE_INFO = {
    "admin": ((), "Full Admin", "Can manage all cluster features (including security). This user can access the "
              "web console. This user can read and write all data."),
    "bucket_admin": (_BUCKET, "Bucket Admin", "Can manage ALL bucket features for a given bucket (including "
                     "start/stop XDCR). This user cannot read data."),
    "bucket_full_access": (_BUCKET, "Application Access", "Full access to bucket data. This user is intended only "
                           "for application access. This user can read and write data."),
    "data_reader": (_COLLECTION, "Data Reader", "Can read data from a given bucket, scope or collection. This user "
                    "is intended only for application access. This user can read data, but cannot write it."),
    "data_writer": (_COLLECTION, "Data Writer", "Can write data to a given bucket, scope or collection. This user "
                    "is intended only for application access. This user can write data, but cannot read it."),
    "data_dcp_reader": (_COLLECTION, "Data DCP Reader", "Can initiate DCP streams for a given bucket, scope or "
                        "collection. This user is intended only for application access. This user can read data."),
    "dcp_reader": (_BUCKET, "DCP Reader", "dcpflow's name for Data DCP Reader: can initiate DCP streams for a given "
                   "bucket and read its data."),
    "replication_target": (_BUCKET, "XDCR Inbound", "Can create XDCR streams into a given bucket."),
}
assert set(ROLE_INFO) == {"admin", *ROLES}, "every role the KV port knows is described here"
MIN_PASSWORD = 6  # ns_server's default password policy
_FORM = {"password", "roles", "name", "groups"}
_ENTERPRISE = "This http API endpoint requires enterprise edition"


def role_json(role: str, *, origins: bool = True) -> dict:
    name, bucket = parse_role(role)
    params = ROLE_INFO[name][0]
    doc = {"role": name}
    for param in params:
        doc[param] = bucket if param == "bucket_name" else "*"
    if origins:
        doc["origins"] = [{"type": "user"}]
    return doc


def user_json(user) -> dict:
    doc = {"id": user.name, "domain": "local", "roles": [role_json(r) for r in user.roles], "groups": [],
           "external_groups": []}
    if user.full_name is not None:
        doc["name"] = user.full_name
    if user.password_change_date is not None:
        doc["password_change_date"] = user.password_change_date
    return doc


def _unknown_user() -> HTTPError:
    return HTTPError(404, '"Unknown user."')


def _domain(request: web.Request) -> str:
    domain = request.match_info["domain"]
    if domain not in ("local", "external"):
        raise HTTPError(404, '"Unknown user domain."')
    return domain


def _check_name(name: str) -> None:
    """ns_server's user-name rules (menelaus_web_rbac.erl, validate_id)."""
    if not name:
        problem = "Username must not be empty"
    elif len(name) > 128:
        problem = "Username may not exceed 128 characters"
    elif name.startswith("@"):
        problem = "Username cannot start with '@'"
    elif any(ord(c) <= 32 or ord(c) == 127 or c in '()<>,;:\\"/[]?={}' for c in name):
        problem = ("Username must not contain spaces, control or any of ()<>,;:\\\"/[]?={} characters and "
                   "must be valid utf8")
    else:
        return
    raise errors({"_": problem})


def _roles(text: str, buckets) -> tuple[list[str], str | None]:
    """The roles of a form's `roles` (comma-separated), and the problem with them if any."""
    roles, bad, why = [], [], ""
    for raw in (r.strip() for r in text.split(",")):
        if not raw:
            continue
        try:
            name, bucket = parse_role(raw)
        except ValueError as e:
            bad.append(raw)
            why = f" ({e})" if "per bucket" in str(e) else why
            continue
        params = ROLE_INFO.get(name, (None,))[0]
        if params is None or bool(params) != (bucket is not None) or (bucket not in (None, "*")
                                                                        and bucket not in buckets):
            bad.append(raw)
            continue
        roles.append(f"{name}[{bucket}]" if bucket is not None else name)
    if bad:
        return roles, ("Cannot assign roles to user because the following roles are unknown, malformed or role "
                       f"parameters are undefined: [{','.join(bad)}]{why}")
    return list(dict.fromkeys(roles)), None


@routes.get("/settings/rbac/roles")
async def get_roles(request: web.Request) -> web.Response:
    require(request, "admin")
    out = []
    for name, (params, display, desc) in ROLE_INFO.items():
        doc = role_json(f"{name}[*]" if params else name, origins=False)
        doc.update({"name": display, "desc": desc})
        out.append(doc)
    return reply_json(out)


@routes.get("/settings/rbac/users")
async def get_all_users(request: web.Request) -> web.Response:
    require(request, "admin")
    users = request.app[SERVER].users
    return reply_json([user_json(users.users[name]) for name in sorted(users.users)])


@routes.get("/settings/rbac/users/{domain}")
async def get_domain_users(request: web.Request) -> web.Response:
    require(request, "admin")
    if _domain(request) == "external":
        return reply_json([])  # no external authentication: no external users
    return await get_all_users(request)


@routes.get("/settings/rbac/users/{domain}/{name}")
async def get_user(request: web.Request) -> web.Response:
    require(request, "admin")
    user = request.app[SERVER].users.get(request.match_info["name"]) if _domain(request) == "local" else None
    if user is None:
        raise _unknown_user()
    return reply_json(user_json(user))


@routes.put("/settings/rbac/users/{domain}/{name}")
async def put_user(request: web.Request) -> web.Response:
    require(request, "admin")
    name = request.match_info["name"]
    _check_name(name)
    if _domain(request) == "external":
        raise HTTPError(400, _ENTERPRISE, "text/plain", headers={"X-enterprise-edition-needed": "1"})
    form = await read_form(request)
    server = request.app[SERVER]
    existing = server.users.get(name)
    problems = {key: "Unsupported key" for key in form if key not in _FORM}
    if form.get("groups"):
        problems["groups"] = "User groups require enterprise edition"
    roles, bad = _roles(form.get("roles", ""), server.buckets)
    if bad is not None:
        problems["roles"] = bad
    password = form.get("password")
    if password is None and existing is None:
        problems["password"] = "Field must be given"
    elif password is not None and (problem := _password_problem(password)):
        problems["password"] = problem
    if problems:
        raise errors(problems)
    full_name = form.get("name", existing.full_name if existing is not None else None)
    if password is not None:  # three PBKDF2 derivations: off the loop
        user = await asyncio.get_running_loop().run_in_executor(None, hashed_user, name, password, roles, full_name)
    else:  # the same credentials, new roles or name
        user = make_user(name, password=existing.password, roles=roles, credentials=existing.credentials,
                         full_name=full_name, password_change_date=existing.password_change_date)
    server.users.upsert(user)
    server.user_changed(name)
    audit_change(request, SET_USER, identity={"domain": "local", "user": name}, roles=list(roles),
                 full_name=full_name or "", reason="updated" if existing else "added")
    server.mgmt.observer.record("user", "", f"user {name!r} {'changed' if existing else 'created'}: "
                                f"roles {', '.join(roles) or 'none'}")
    return reply_json("")


def _password_problem(password: str) -> str | None:
    """ns_server's default password policy (menelaus_web_rbac.erl, is_valid_password)."""
    if len(password) < MIN_PASSWORD:
        return f"The password must be at least {MIN_PASSWORD} characters long."
    if any(ord(c) < 32 or ord(c) == 127 for c in password):
        return "The password must not contain control characters"
    return None


@routes.post("/controller/changePassword")
async def change_password(request: web.Request) -> web.Response:
    """The authenticated user's own password (its roles stay); 200 with no body, as ns_server."""
    user = request.get(USER)
    if user is None:
        raise unauthorized()
    form = await read_form(request)
    problems = {key: "Unsupported key" for key in form if key != "password"}
    password = form.get("password")
    problems.update({"password": "The value must be supplied"} if password is None else
                    {"password": p} if (p := _password_problem(password)) else {})
    if problems:
        raise errors(problems)
    server = request.app[SERVER]
    hashed = await asyncio.get_running_loop().run_in_executor(None, hashed_user, user.name, password, ())
    current = server.users.get(user.name)  # as it is now (changed or dropped while the keys were derived?)
    if current is None:
        raise _unknown_user()
    server.users.upsert(make_user(current.name, roles=current.roles, credentials=hashed.credentials,
                                  full_name=current.full_name, password_change_date=hashed.password_change_date))
    server.user_changed(user.name)
    audit_change(request, SET_USER, identity={"domain": "local", "user": user.name}, roles=list(current.roles),
                 full_name=current.full_name or "", reason="password changed")
    return web.Response(status=200)


@routes.delete("/settings/rbac/users/{domain}/{name}")
async def delete_user(request: web.Request) -> web.Response:
    require(request, "admin")
    name = request.match_info["name"]
    server = request.app[SERVER]
    if _domain(request) != "local" or not server.users.drop(name):
        raise _unknown_user()
    server.user_changed(name)
    audit_change(request, DELETE_USER, identity={"domain": "local", "user": name})
    server.mgmt.observer.record("user", "", f"user {name!r} dropped: its connections lost their privileges")
    return reply_json("")
