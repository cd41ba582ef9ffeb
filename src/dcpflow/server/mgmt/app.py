"""The management listener: HTTP beside the KV port, on the port the cluster map advertises as
`mgmt` (and `mgmtSSL` with TLS), as ns_server serves its REST API beside memcached.

Why aiohttp: the server is one asyncio event loop (uvloop when installed) that owns the engine
(engine/bucket.py: one owner thread). aiohttp's server runs on that same loop - an `AppRunner`
with a `SockSite` per bound socket - so every handler reads and changes engine state directly,
with no thread hand-off, and a slow HTTP client costs a coroutine, never a thread. It is
maintained by the aio-libs group, has no C requirement beyond optional speedups, and serves TLS
with the ssl context the KV port uses.

What this module owns, the same for every router:

* Binding - `bind()` runs before any bucket is opened, so a port in use fails the start cleanly.
  With no port given it takes ns_server's (8091, 18091 for TLS) when free, else any free port;
  whichever it bound is what the map advertises.
* Authentication - HTTP basic auth with the KV port's users (server/auth.py), or the session
  cookie `/uilogin` sets for the web page (accepted for GET and HEAD only, so a page elsewhere
  cannot make a logged-in browser change anything). A request without credentials for a
  protected resource gets ns_server's 401; `require()` checks a permission (the same RBAC roles
  as the KV port) and answers ns_server's 403 naming the permission. Wrong credentials count for
  the server's login throttle (server/throttle.py): while it locks the client out, credentials
  are not looked at and the answer is 429 with Retry-After. Every 401, 403 and lockout is in the
  audit trail (server/audit.py, ns_server's events 8264 and 8275; 8193 for the login form).
* Connections - at most the server's `mgmt_max_connections` (fitted to the descriptor limit with
  the KV port's, server/app.py). A connection must send its first request within the server's
  `auth_timeout` and may then stay idle between requests for `http_idle_timeout`; with every slot
  taken, a new connection closes the oldest connection that has no request in progress (one that
  never sent a request first), so idle sockets can never keep an administrator out.
* Errors - every error is an HTTP status with an ns_server-shaped body: malformed form or JSON
  bodies 400, unknown resources 404, bodies over MAX_BODY 413, anything unexpected 500 with
  the details in the server log, never in the answer.

Routers are modules with a `routes` table (aiohttp's RouteTableDef) listed in ROUTERS. To add
one, write `mgmt/<name>.py` with `routes = web.RouteTableDef()`,
handlers that start with `require(request, <permission>)`, and add the module to ROUTERS.
"""

import asyncio
import base64
import binascii
import errno
import hashlib
import hmac
import json
import logging
import math
import re
import secrets
import socket
import ssl
import time
from collections import OrderedDict
from urllib.parse import parse_qsl

from aiohttp import web

from dcpflow.protocol.config import DEFAULT_MGMT_PORT, DEFAULT_MGMT_SSL_PORT

from ..audit import ACCESS_FORBIDDEN, HTTP_AUTHENTICATION_FAILURE
from ..auth import Privilege, User, parse_role
from ..listener import LISTEN_BACKLOG, Listener
from .observe import Observer

log = logging.getLogger("dcpflow.server.mgmt")

#: Request bodies above this are refused with 413 before they are read.
MAX_BODY = 1024 * 1024
#: The Server this application serves (handlers: `request.app[SERVER]`).
SERVER = web.AppKey("server", object)
LISTENER = web.AppKey("listener", object)
#: The authenticated user of a request (None: no credentials).
USER = web.RequestKey("user", object)
#: The web page's session cookie and how long an idle session lives.
SESSION_COOKIE = "ui-auth-token"
SESSION_IDLE_SECONDS = 3600.0
MAX_SESSIONS = 256
#: Authenticated (user, password) pairs remembered, so basic auth does not run PBKDF2 per request.
MAX_REMEMBERED_LOGINS = 64

_REALM = 'Basic realm="Couchbase Server Admin / REST"'  # ns_server's
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


# ---------------------------------------------------------------------------------------------
# errors, shaped as ns_server answers them


class HTTPError(web.HTTPException):
    """An error answer with any status and body (aiohttp's classes fix the status per class)."""

    def __init__(self, status: int, body: str, content_type: str = "application/json", headers=None):
        self.status_code = status
        super().__init__(text=body, content_type=content_type, headers=headers)


def error(status: int, message: str, *, field: str = "_") -> HTTPError:
    """A validation-style error: {"errors": {field: message}} (what the SDKs parse)."""
    return _json_error(status, {"errors": {field: message}})


def _json_error(status: int, body: dict) -> HTTPError:
    return HTTPError(status, json.dumps(body))


def not_found() -> HTTPError:
    """ns_server's answer for a bucket or resource that does not exist."""
    return HTTPError(404, "Requested resource not found.\r\n", "text/plain")


def errors(field_errors: dict[str, str]) -> HTTPError:
    """Several validation errors at once, as ns_server reports a bucket's parameters."""
    return _json_error(400, {"errors": dict(field_errors), "summaries": {}})


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except HTTPError:
        raise
    except web.HTTPRequestEntityTooLarge:
        raise error(413, f"Request body is larger than {MAX_BODY} bytes") from None
    except web.HTTPMethodNotAllowed:
        raise error(405, f"Method {request.method} is not allowed on {request.path}") from None
    except web.HTTPNotFound:
        raise HTTPError(404, "Not found.\r\n", "text/plain") from None
    except web.HTTPException:
        raise
    except Exception:
        # The details go to the log; the client learns only that it was not its fault.
        log.exception("management request %s %s failed", request.method, request.path)
        raise error(500, "Unexpected server error, request logged.") from None


# ---------------------------------------------------------------------------------------------
# authentication and permissions


#: Permissions a handler can require, with the ns_server permission a 403 names.
PERMISSIONS = {
    "pools.read": "cluster.pools!read",
    "bucket.read": "cluster.bucket[{bucket}].settings!read",
    "bucket.stats": "cluster.bucket[{bucket}].stats!read",
    "bucket.write": "cluster.bucket[{bucket}].settings!write",
    "bucket.flush": "cluster.bucket[{bucket}].data!flush",
    "bucket.create": "cluster.buckets!create",
    "bucket.delete": "cluster.bucket[{bucket}]!delete",
    "admin": "cluster.admin!write",
    "stats": "cluster.stats!read",
}


def allowed(user: User, permission: str, bucket: str | None = None) -> bool:
    """The REST side of the KV port's RBAC (server/auth.py roles): admin may do anything; a
    bucket's roles let a user read it (any role), read its stats (STATS privilege), and manage
    its settings, flush it and its scopes (bucket_admin); creating and deleting buckets and the
    cluster's own settings are admin's."""
    if user.is_admin:
        return True
    if permission == "pools.read":
        return True
    if permission == "stats":
        return any(user.privileges(b) & Privilege.STATS for b in user.bucket_privileges)
    if bucket is None:
        return False
    if permission == "bucket.read":
        return user.may_access(bucket)
    if permission == "bucket.stats":
        return bool(user.privileges(bucket) & Privilege.STATS)
    if permission in ("bucket.write", "bucket.flush"):
        return _has_role(user, "bucket_admin", bucket)
    return False


def _has_role(user: User, role: str, bucket: str) -> bool:
    for text in user.roles:
        name, on = parse_role(text)
        if name == role and on in (bucket, "*"):
            return True
    return False


def unauthorized() -> HTTPError:
    """ns_server's 401: an empty body and the basic-auth challenge."""
    return HTTPError(401, "", "text/plain", headers={"WWW-Authenticate": _REALM})


def require(request: web.Request, permission: str, bucket: str | None = None) -> User:
    """The request's user if it may do `permission` (on `bucket`); else ns_server's 401 (no or
    wrong credentials) or 403 (naming the permission it lacks)."""
    user = request.get(USER)
    if user is None:
        _audit(request, HTTP_AUTHENTICATION_FAILURE, None, raw_url=request.raw_path, reason="no credentials")
        raise unauthorized()
    if not allowed(user, permission, bucket):
        _audit(request, ACCESS_FORBIDDEN, user.name, raw_url=request.raw_path, method=request.method,
              bucket_name=bucket or "", reason=f"lacks {PERMISSIONS[permission].format(bucket=bucket)}")
        raise _json_error(403, {"message": "Forbidden. User needs the following permissions",
                                "permissions": [PERMISSIONS[permission].format(bucket=bucket)]})
    return user


def path_bucket(request: web.Request, permission: str):
    """The bucket named in the path, once the user may do `permission` on it (403 before 404:
    a user without access learns nothing about which buckets exist)."""
    name = request.match_info["bucket"]
    require(request, permission, name)
    bucket = request.app[SERVER].buckets.get(name)
    if bucket is None:
        raise not_found()
    return bucket


class Logins:
    """Who is logged in: basic-auth pairs already checked (bounded), and the web page's sessions."""

    def __init__(self, users):
        self.users = users
        self._checked: OrderedDict[bytes, User] = OrderedDict()
        self._key = secrets.token_bytes(32)
        self.sessions: OrderedDict[str, tuple[User, float]] = OrderedDict()

    def check(self, name: str, password: str) -> User | None:
        """The user if the password is right. A right pair is remembered by its keyed hash, so the
        SDK's basic auth on every request does not cost a PBKDF2 derivation each time."""
        digest = hmac.digest(self._key, f"{name}\x00{password}".encode(), hashlib.sha256)
        user = self._checked.get(digest)
        if user is not None:
            self._checked.move_to_end(digest)
            return user
        user = self.users.get(name)
        if user is None or not user.check_password(password):
            return None
        self._checked[digest] = user
        while len(self._checked) > MAX_REMEMBERED_LOGINS:
            self._checked.popitem(last=False)
        return user

    def forget(self, name: str) -> None:
        """`name` was changed or dropped (user management): its remembered logins and web sessions
        go, so the next request is checked against what the user is now."""
        for digest in [d for d, user in self._checked.items() if user.name == name]:
            del self._checked[digest]
        for token in [t for t, (user, _) in self.sessions.items() if user.name == name]:
            del self.sessions[token]

    def open_session(self, user: User) -> str:
        token = secrets.token_urlsafe(32)
        self.sessions[token] = (user, time.monotonic())
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return token

    def session(self, token: str) -> User | None:
        entry = self.sessions.get(token)
        if entry is None:
            return None
        user, seen = entry
        if time.monotonic() - seen > SESSION_IDLE_SECONDS:
            del self.sessions[token]
            return None
        self.sessions[token] = (user, time.monotonic())
        self.sessions.move_to_end(token)
        return user

    def close_session(self, token: str) -> None:
        self.sessions.pop(token, None)


def _basic_credentials(header: str) -> tuple[str, str] | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    name, sep, password = text.partition(":")
    return (name, password) if sep else None


@web.middleware
async def _authenticate(request: web.Request, handler):
    """Sets request["user"] from basic auth or the page's session cookie (GET/HEAD only). Wrong
    credentials are a 401 at once, as ns_server answers them, whatever the resource."""
    logins: Logins = request.app[LISTENER].logins
    header = request.headers.get("Authorization")
    if header is not None:
        creds = _basic_credentials(header)
        if creds is None:
            _audit(request, HTTP_AUTHENTICATION_FAILURE, "", raw_url=request.raw_path,
                  reason="malformed basic credentials")
            raise unauthorized()
        user = check_login(request, *creds, event=HTTP_AUTHENTICATION_FAILURE)
        if user is None:
            raise unauthorized()
        request[USER] = user
    elif request.method in ("GET", "HEAD") and (token := request.cookies.get(SESSION_COOKIE)):
        request[USER] = logins.session(token)
    return await handler(request)


def check_login(request: web.Request, name: str, password: str, *, event) -> User | None:
    """The user if `password` is theirs; None (audited as `event`, counted by the login throttle)
    if not; 429 with Retry-After, without a look at the password, while the throttle locks this
    client's address or - for an address that failed as them - this user out."""
    server = request.app[SERVER]
    address = _remote_ip(request)
    wait = server.throttle.check(address, name)
    if wait:
        seconds = math.ceil(wait)
        _audit(request, event, name, raw_url=request.raw_path,
              reason=f"locked out after failed logins: try again in {seconds} s")
        message = f"Too many failed logins from this address or as this user: try again in {seconds} s"
        raise HTTPError(429, json.dumps({"message": message}), headers={"Retry-After": str(seconds)})
    user = request.app[LISTENER].logins.check(name, password)
    if user is None:
        server.throttle.failed(address, name)
        _audit(request, event, name, raw_url=request.raw_path, reason="unknown user or wrong password")
        return None
    server.throttle.succeeded(address, name)
    return user


def _remote_ip(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) else str(request.remote)


def audit_change(request: web.Request, event, **fields) -> None:
    """A change made through the management API (a bucket, a scope, a user...), by the request's user."""
    user = request.get(USER)
    _audit(request, event, user.name if user is not None else None, **fields)


def _audit(request: web.Request, event, user: str | None, **fields) -> None:
    """An event of the management port in the server's audit trail (server/audit.py): the client's
    and the server's addresses, the user (None: no credentials) and the event's own fields."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    sock = transport.get_extra_info("sockname") if transport is not None else None
    request.app[SERVER].audit.record(event, remote=peer or str(request.remote), local=sock or "?", user=user,
                                     **fields)


@web.middleware
async def _track(request: web.Request, handler):
    """The listener knows which connections have a request in progress (ManagementListener)."""
    listener = request.app[LISTENER]
    listener.request_started(request.protocol)
    try:
        return await handler(request)
    finally:
        listener.request_done(request.protocol)


def _peer_of(handler: web.RequestHandler) -> str:
    peer = handler.transport.get_extra_info("peername") if handler.transport is not None else None
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"


# ---------------------------------------------------------------------------------------------
# request bodies


async def read_form(request: web.Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body as a dict; 400 for a malformed one (bad
    percent-encoding or UTF-8, a field without '=', a field given twice, a JSON body)."""
    if request.content_type == "application/json":
        raise error(400, "Expected an application/x-www-form-urlencoded body, got application/json")
    body = await request.read()  # over MAX_BODY: 413
    try:
        text = body.decode("utf-8")
        if (bad := _BAD_ESCAPE.search(text)) is not None:
            raise ValueError(f"bad percent-encoding {text[bad.start():bad.start() + 3]!r}")
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True, errors="strict") if text else []
    except (UnicodeDecodeError, ValueError) as e:
        raise error(400, f"Malformed form body: {e}") from None
    form: dict[str, str] = {}
    for key, value in pairs:
        if key in form:
            raise error(400, f"Parameter {key!r} is given more than once", field=key)
        form[key] = value
    return form


async def read_json(request: web.Request):
    """A JSON body; 400 for malformed JSON or UTF-8 (413 over MAX_BODY)."""
    body = await request.read()
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise error(400, f"Malformed JSON body: {type(e).__name__}: {e}") from None


def reply_json(doc, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(doc, separators=(",", ":")), status=status, content_type="application/json")


def request_host(request: web.Request) -> str:
    """The address the client dialled: replaces `$HOST` in maps, as the KV port's clients do."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    host = sockname[0] if sockname else "127.0.0.1"
    return f"[{host}]" if ":" in host else host


# ---------------------------------------------------------------------------------------------
# the listener


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


def _bind(host: str, port: int | None, preferred: int) -> socket.socket:
    """`port` None: `preferred` if free, else any free port; 0: any free port; else exactly it."""
    if port is not None:
        return _listen(host, port)
    try:
        return _listen(host, preferred)
    except OSError as e:
        if e.errno not in (errno.EADDRINUSE, errno.EACCES):
            raise
        log.info("management port %d is in use: listening on a free port instead", preferred)
        return _listen(host, 0)


class ManagementListener:
    """See the module docstring. One per Server: `bind()`, `start()` once the server's buckets and
    map exist, `close()` first when the server stops. `routers` are the modules whose `routes` it
    serves (the package's ROUTERS): registered by whoever makes the listener, so this module
    imports none of them (they import it)."""

    def __init__(self, server, routers):
        self.server = server
        self.routers = tuple(routers)
        self.port: int | None = None
        self.tls_port: int | None = None
        self.logins = Logins(server.users)
        self.observer = Observer(server)
        self._socks: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._runner: web.AppRunner | None = None
        self._listeners: list[Listener] = []
        # accepted sockets handed to aiohttp -> the task making the connection: counted while their
        # handler has no transport (open_connections), then among aiohttp's connections
        self._opening: dict[web.RequestHandler, asyncio.Task] = {}
        self.closing = False  # the config streams (streaming.py) end when set
        # connections with no request in progress, oldest first -> since when: those that never sent
        # one (closed after auth_timeout, evicted first) and those between requests (http_idle_timeout)
        self._fresh: OrderedDict[web.RequestHandler, float] = OrderedDict()
        self._idle: OrderedDict[web.RequestHandler, float] = OrderedDict()
        self._busy: dict[web.RequestHandler, int] = {}  # requests in progress per connection

    def bind(self, host: str, port: int | None, tls_port: int | None, tls: ssl.SSLContext | None) -> None:
        sock = _bind(host, port, DEFAULT_MGMT_PORT)
        self._socks.append((sock, None))
        self.port = sock.getsockname()[1]
        if tls is not None:
            tls_sock = _bind(host, tls_port, DEFAULT_MGMT_SSL_PORT)
            self._socks.append((tls_sock, tls))
            self.tls_port = tls_sock.getsockname()[1]

    def unbind(self) -> None:
        for sock, _ in self._socks:
            sock.close()
        self._socks.clear()

    def application(self) -> web.Application:
        app = web.Application(middlewares=[_track, _errors, _authenticate], client_max_size=MAX_BODY)
        app[SERVER] = self.server
        app[LISTENER] = self
        for router in self.routers:
            app.router.add_routes(router.routes)
        return app

    async def start(self) -> None:
        """Serve: the KV port's accept loop (server/listener.py) hands each connection to aiohttp,
        so running out of descriptors pauses this port too and is logged at a bounded rate."""
        self._runner = web.AppRunner(self.application(), access_log=None, shutdown_timeout=1.0,
                                     keepalive_timeout=self.server.config.http_idle_timeout)
        await self._runner.setup()
        for sock, tls in self._socks:
            listener = Listener([sock], tls, self._accepted, self.server._exhausted)
            listener.start()
            self._listeners.append(listener)
        self.observer.start()

    @property
    def open_connections(self) -> int:
        """HTTP connections open, or being opened (a TLS handshake)."""
        if self._runner is None:
            return 0
        # a handler is made (has its transport) a pass or two before its task ends: counted once
        return len(self._runner.server.connections) + sum(h.transport is None for h in self._opening)

    def _accepted(self, sock: socket.socket, tls: ssl.SSLContext | None) -> bool:
        """Hand an accepted socket to aiohttp. At `mgmt_max_connections` (each costs a descriptor
        and a handler: a client opening connections without end must not take the node's
        descriptors from KV) the oldest connection without a request in progress makes room -
        one that never sent a request first -, or with none `sock` is closed at once."""
        server = self.server
        n = self.open_connections
        keep_accepting = True
        if n >= server.mgmt_max_connections and not self._evict():
            if not self._opening:
                server.refused_connections["http_limit"] += 1
                server.log.warning("http-connection-limit", "refused an HTTP connection: all %d open on the "
                                   "management port (its limit, fitted to the descriptor limit) have a request in "
                                   "progress", n)
                sock.close()
                return True
            # connections still being made have sent nothing either: admitted, the oldest silent one
            # beyond the limit is closed once this one is made (_open), and the listener waits a pass
            keep_accepting = False
        loop = asyncio.get_running_loop()
        handler = self._runner.server()  # aiohttp's protocol factory
        task = loop.create_task(self._open(loop, handler, sock, tls))
        self._opening[handler] = task
        task.add_done_callback(lambda _: self._opening.pop(handler, None))
        return keep_accepting

    async def _open(self, loop: asyncio.AbstractEventLoop, handler: web.RequestHandler, sock: socket.socket,
                    tls: ssl.SSLContext | None) -> None:
        try:
            await loop.connect_accepted_socket(
                lambda: handler, sock, ssl=tls,
                ssl_handshake_timeout=self.server.config.auth_timeout if tls else None)
        except (OSError, ssl.SSLError, TimeoutError):  # a failed TLS handshake, a client that left
            sock.close()
            return
        self._fresh[handler] = time.monotonic()
        if len(self._runner.server.connections) > self.server.mgmt_max_connections:
            self._evict()  # one for one (those closed a moment ago may still be counted)

    def request_started(self, handler: web.RequestHandler) -> None:
        self._fresh.pop(handler, None)
        self._idle.pop(handler, None)
        self._busy[handler] = self._busy.get(handler, 0) + 1

    def request_done(self, handler: web.RequestHandler) -> None:
        left = self._busy.pop(handler, 1) - 1
        if left:
            self._busy[handler] = left
        elif handler.transport is not None:
            self._idle[handler] = time.monotonic()

    def _evict(self) -> bool:
        """Close the oldest connection with no request in progress; False if there is none."""
        for table in (self._fresh, self._idle):
            while table:
                handler, since = table.popitem(last=False)
                if handler.transport is None or handler.transport.is_closing():
                    continue  # closed meanwhile
                self.server.refused_connections["http_evicted"] += 1
                self.server.log.warning("http-connection-limit", "closed an HTTP connection from %s, %s for %.1f s, "
                                        "to admit a new one: all %d are open", _peer_of(handler),
                                        "silent" if table is self._fresh else "idle", time.monotonic() - since,
                                        self.server.mgmt_max_connections)
                handler.force_close()
                return True
        return False

    def expire_idle(self) -> None:
        """Close connections silent for auth_timeout since they were accepted, or idle for
        http_idle_timeout since their last request; forget those that closed (every second)."""
        if self._runner is None:
            return
        live = set(self._runner.server.connections)
        now = time.monotonic()
        for table, timeout in ((self._fresh, self.server.config.auth_timeout),
                               (self._idle, self.server.config.http_idle_timeout)):
            for handler in [h for h in table if h not in live]:
                del table[handler]
            while table:
                handler, since = next(iter(table.items()))
                if now - since < timeout:
                    break
                del table[handler]
                self.server.refused_connections["http_timeout"] += 1
                self.server.log.warning("http-timeout", "closing an HTTP connection from %s: %s for %g s",
                                        _peer_of(handler), "no request" if table is self._fresh else "idle", timeout)
                handler.force_close()
        for handler in [h for h in self._busy if h not in live]:
            del self._busy[handler]

    async def close(self) -> None:
        self.closing = True
        if self.server.topology is not None:
            self.server.topology.notify()  # wakes the config streams, which end (streaming.py)
        for listener in self._listeners:
            listener.close()  # closes the sockets of _socks
        self._listeners.clear()
        for task in list(self._opening.values()):
            task.cancel()
        await self.observer.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.unbind()
