"""Users, roles and SASL for the server: PLAIN and SCRAM-SHA1/256/512 (RFC 5802), server side.

References (under https://github.com/couchbase/kv_engine/blob/master/): docs/sasl.md
(LIST_MECHS / AUTH / STEP framing and example exchanges), cbsasl/CBSASL.md (mechanisms; the
password database keeps only salted SCRAM keys), docs/rbac.md (privileges are per bucket, checked
per command). The official SDKs always start SCRAM-SHA512 over plain TCP, and their nonce may
contain spaces.

The users file is JSON::

    {"users": {
        "Administrator": {"password": "password", "roles": ["admin"]},
        "reader": {"password": "s3cret", "roles": ["data_reader[default]"]},
        "xdcr": {"scram-sha-512": {"hashes": [{"server_key": "...", "stored_key": "..."}],
                                   "salt": "...", "iterations": 4096},
                 "roles": ["replication_target[*]"]}}}

A user has either a plain `password` (kept only to derive SCRAM keys; fine for tests and demos)
or CBSASL-style `scram-sha-512` / `scram-sha-256` / `scram-sha-1` entries (several hashes allow
password rotation). PLAIN is checked against the SCRAM keys, so a hashed user needs no plain text.
Roles are `admin` or `ROLE[bucket]` with `*` for every bucket (`ROLE[bucket:*:*]`, ns_server's
collection-aware spelling, is the same); see ROLES. An entry may also have `name` (the full
name) and `password_change_date`.

Users change at run time through the management port's user REST (server/mgmt/users.py):
`UserDB.upsert` / `UserDB.drop`. With an overlay file (`attach_overlay`, the server's
`<data_dir>/users-managed.json`) those changes are kept across restarts: the overlay lists the users
made or changed that way (SCRAM hashes only, never a password) and the names dropped, applied over
the users the server starts with (its users file, or the default admin), so the users file keeps
working as it did and a change made over REST wins over it.
"""

import base64
import hashlib
import hmac
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntFlag
from pathlib import Path

DEFAULT_ITERATIONS = 4096  # RFC 7677's minimum; the client pays this cost at every SCRAM login


class Privilege(IntFlag):
    """What a command needs (rbac.md names Read, Upsert, MetaRead, DcpProducer...; grouped here)."""

    NONE = 0
    READ = 0x01
    WRITE = 0x02  # insert, upsert, delete, touch
    META_READ = 0x04  # GET_META, seqnos, failover logs, observe
    META_WRITE = 0x08  # *WithMeta (XDCR-style replication)
    DCP_PRODUCER = 0x10
    DCP_CONSUMER = 0x20
    STATS = 0x40
    NODE_MANAGEMENT = 0x80  # SET_VBUCKET, persistence control, cluster maps: the cluster manager's
    # System xattrs (keys starting with '_') through sub-document commands (ExtendedAttributes.md)
    SYSTEM_XATTR_READ = 0x100
    SYSTEM_XATTR_WRITE = 0x200


ALL_PRIVILEGES = Privilege(0x3FF)
_P = Privilege

#: Per-bucket roles (Couchbase role names) and the privileges each grants on its bucket.
ROLES: dict[str, Privilege] = {
    "bucket_admin": ALL_PRIVILEGES & ~_P.NODE_MANAGEMENT,
    "bucket_full_access": _P.READ | _P.WRITE | _P.META_READ | _P.DCP_PRODUCER | _P.STATS | _P.SYSTEM_XATTR_READ
    | _P.SYSTEM_XATTR_WRITE,
    "data_reader": _P.READ | _P.META_READ | _P.STATS,
    "data_writer": _P.WRITE | _P.STATS,
    "dcp_reader": _P.READ | _P.META_READ | _P.DCP_PRODUCER | _P.STATS,
    "data_dcp_reader": _P.READ | _P.META_READ | _P.DCP_PRODUCER | _P.STATS,
    "replication_target": _P.META_READ | _P.META_WRITE | _P.WRITE | _P.STATS,
}

#: SASL mechanism name -> hashlib name, strongest first (the order LIST_MECHS advertises).
SCRAM_MECHANISMS = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}
MECHANISMS = (*SCRAM_MECHANISMS, "PLAIN")
_CBSASL_KEYS = {"sha512": "scram-sha-512", "sha256": "scram-sha-256", "sha1": "scram-sha-1"}


class AuthFailed(Exception):
    """The exchange failed (AUTH_ERROR). The reason is for the server log, never for the client:
    telling a client whether the user exists would help an attacker."""


class BadCredentials(AuthFailed):
    """The credentials were checked and are wrong (an unknown user or a wrong password): what the
    login throttle counts (throttle.py), unlike a malformed exchange."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise AuthFailed("bad base64") from None


@dataclass(frozen=True)
class ScramCredential:
    """What the server stores for one hash algorithm (RFC 5802 section 3): never the password."""

    salt: bytes
    iterations: int
    keys: tuple[tuple[bytes, bytes], ...]  # (stored_key, server_key) pairs: several during rotation

    @classmethod
    def derive(cls, algorithm: str, password: str, salt: bytes | None = None,
               iterations: int = DEFAULT_ITERATIONS) -> "ScramCredential":
        salt = os.urandom(16) if salt is None else salt
        return cls(salt, iterations, (scram_keys(algorithm, password.encode(), salt, iterations),))

    def to_json(self) -> dict:
        return {"hashes": [{"stored_key": _b64(s), "server_key": _b64(k)} for s, k in self.keys],
                "salt": _b64(self.salt), "iterations": self.iterations}

    @classmethod
    def from_json(cls, doc: dict) -> "ScramCredential":
        keys = tuple((base64.b64decode(h["stored_key"]), base64.b64decode(h["server_key"]))
                     for h in doc["hashes"])
        if not keys:
            raise ValueError("a SCRAM entry needs at least one hash")
        return cls(base64.b64decode(doc["salt"]), int(doc["iterations"]), keys)


def scram_keys(algorithm: str, password: bytes, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) of a password (RFC 5802 section 3)."""
    salted = hashlib.pbkdf2_hmac(algorithm, password, salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", algorithm)
    return hashlib.new(algorithm, client_key).digest(), hmac.digest(salted, b"Server Key", algorithm)


@dataclass
class User:
    name: str
    roles: tuple[str, ...] = ()
    password: str | None = None
    credentials: dict[str, ScramCredential] = field(default_factory=dict)  # by hashlib name
    is_admin: bool = False
    bucket_privileges: dict[str, Privilege] = field(default_factory=dict)  # "*" = every bucket
    full_name: str | None = None
    password_change_date: str | None = None  # ISO 8601, as ns_server reports it

    def credential(self, algorithm: str) -> ScramCredential | None:
        """The SCRAM keys for `algorithm`, derived from the plain password on first use."""
        cred = self.credentials.get(algorithm)
        if cred is None and self.password is not None:
            cred = self.credentials[algorithm] = ScramCredential.derive(algorithm, self.password)
        return cred

    def privileges(self, bucket: str | None) -> Privilege:
        """What this user may do in `bucket` (an exact entry wins over the `*` one, as in rbac.md)."""
        if self.is_admin:
            return ALL_PRIVILEGES
        if bucket is None:
            return _P.NONE
        found = self.bucket_privileges.get(bucket)
        return found if found is not None else self.bucket_privileges.get("*", _P.NONE)

    def may_access(self, bucket: str) -> bool:
        return bool(self.privileges(bucket))

    def to_json(self) -> dict:
        """The user as a users-file entry, with SCRAM hashes for every algorithm it can have and
        never a plain password."""
        entry: dict = {}
        for algorithm, key in _CBSASL_KEYS.items():
            cred = self.credential(algorithm)
            if cred is not None:
                entry[key] = cred.to_json()
        entry["roles"] = list(self.roles)
        if self.full_name is not None:
            entry["name"] = self.full_name
        if self.password_change_date is not None:
            entry["password_change_date"] = self.password_change_date
        return entry

    def check_password(self, password: str) -> bool:
        """PLAIN: compare with the plain password, else against any stored SCRAM key."""
        if self.password is not None:
            return hmac.compare_digest(self.password.encode(), password.encode())
        if not self.credentials:
            return False
        # One algorithm is enough: every entry hashes the same password(s).
        algorithm, cred = next(iter(self.credentials.items()))
        mine, _ = scram_keys(algorithm, password.encode(), cred.salt, cred.iterations)
        return any(hmac.compare_digest(mine, stored) for stored, _ in cred.keys)


def parse_role(role: str) -> tuple[str, str | None]:
    """`admin` -> ("admin", None); `data_reader[default]` -> ("data_reader", "default"); ns_server's
    `data_reader[default:*:*]` (every scope and collection of the bucket) is the same. Roles are
    granted per bucket here: a role on one scope or collection is a ValueError."""
    role = role.strip()
    if "[" not in role:
        return role, None
    name, _, rest = role.partition("[")
    if not rest.endswith("]") or not rest[:-1]:
        raise ValueError(f"role {role!r} must look like name[bucket]")
    bucket, *within = rest[:-1].split(":")
    if len(within) > 2 or not bucket:
        raise ValueError(f"role {role!r} must look like name[bucket] or name[bucket:scope:collection]")
    if any(part != "*" for part in within):
        raise ValueError(f"role {role!r} is on a scope or collection: dcpflow grants roles per bucket "
                         f"(name[bucket], or name[bucket:*:*])")
    return name, bucket


def make_user(name: str, *, password: str | None = None, roles: Iterable[str] = (),
              credentials: dict[str, ScramCredential] | None = None, full_name: str | None = None,
              password_change_date: str | None = None) -> User:
    user = User(name, tuple(roles), password, dict(credentials or {}), full_name=full_name,
                password_change_date=password_change_date)
    if password is None and not user.credentials:
        raise ValueError(f"user {name!r} needs a password or SCRAM hashes")
    for role in user.roles:
        rname, bucket = parse_role(role)
        if rname == "admin" and bucket is None:
            user.is_admin = True
        elif rname in ROLES and bucket is not None:
            user.bucket_privileges[bucket] = user.bucket_privileges.get(bucket, _P.NONE) | ROLES[rname]
        else:
            known = ", ".join(["admin", *(f"{r}[bucket]" for r in ROLES)])
            raise ValueError(f"user {name!r}: unknown role {role!r} (known: {known}; bucket may be *)")
    return user


def hashed_user(name: str, password: str, roles: Iterable[str], full_name: str | None = None) -> User:
    """A user made at run time: SCRAM keys for every algorithm, derived once, and no plain text."""
    creds = {algorithm: ScramCredential.derive(algorithm, password) for algorithm in _CBSASL_KEYS}
    return make_user(name, roles=roles, credentials=creds, full_name=full_name,
                     password_change_date=time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()))


class UserDB:
    """The users the server knows, by name; see the module docstring for run-time changes."""

    def __init__(self, users: Iterable[User] = ()):
        self.users = {u.name: u for u in users}
        self._secret = os.urandom(32)  # salts for users that do not exist (see ScramServer)
        self.overlay_path: Path | None = None
        self._overlay: dict = {"users": {}, "dropped": []}

    def get(self, name: str) -> User | None:
        return self.users.get(name)

    def attach_overlay(self, path: str | Path) -> None:
        """Apply the run-time changes kept in `path` (if it exists) and keep the next ones there."""
        self.overlay_path = Path(path)
        try:
            doc = json.loads(self.overlay_path.read_text(encoding="utf-8"))
            made = UserDB.from_json({"users": doc["users"]})
            dropped = [str(n) for n in doc["dropped"]]
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{self.overlay_path} is damaged ({e}): fix or remove it (it keeps the users made, "
                             f"changed and dropped through the management API)") from None
        self._overlay = {"users": doc["users"], "dropped": dropped}
        for name in dropped:
            self.users.pop(name, None)
        self.users.update(made.users)

    def upsert(self, user: User) -> None:
        """Add or replace a user (kept in the overlay, if there is one)."""
        self.users[user.name] = user
        self._overlay["users"][user.name] = user.to_json()
        self._overlay["dropped"] = [n for n in self._overlay["dropped"] if n != user.name]
        self._save()

    def drop(self, name: str) -> bool:
        """Remove a user; False if there was none."""
        if self.users.pop(name, None) is None:
            return False
        self._overlay["users"].pop(name, None)
        if name not in self._overlay["dropped"]:
            self._overlay["dropped"].append(name)
        self._save()
        return True

    def _save(self) -> None:
        if self.overlay_path is None:
            return
        self.overlay_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.overlay_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # SCRAM hashes: the owner's only
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(self._overlay, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.overlay_path)

    @classmethod
    def default(cls, name: str = "Administrator", password: str = "password") -> "UserDB":
        return cls([make_user(name, password=password, roles=["admin"])])

    @classmethod
    def from_json(cls, doc: dict) -> "UserDB":
        users = doc.get("users") if isinstance(doc, dict) else None
        if not isinstance(users, dict):
            raise ValueError('the users file must be a JSON object {"users": {name: {...}}}')
        out = []
        for name, entry in users.items():
            creds = {alg: ScramCredential.from_json(entry[key])
                     for alg, key in _CBSASL_KEYS.items() if key in entry}
            out.append(make_user(name, password=entry.get("password"), roles=entry.get("roles", ()),
                                 credentials=creds, full_name=entry.get("name"),
                                 password_change_date=entry.get("password_change_date")))
        return cls(out)

    @classmethod
    def load(cls, path: str | Path) -> "UserDB":
        with open(path, encoding="utf-8") as fh:
            return cls.from_json(json.load(fh))

    def fake_salt(self, name: str) -> bytes:
        """A stable salt for an unknown user, so the exchange looks the same as for a real one."""
        return hmac.digest(self._secret, name.encode(), "sha256")[:16]


# ---------------------------------------------------------------------------------------------
# SASL mechanisms, server side. Each is a small state machine: start(payload) then step(payload);
# each returns (done, server message) or raises AuthFailed.


def plain_authenticate(users: UserDB, payload: bytes) -> User:
    """PLAIN (RFC 4616): `authzid NUL authcid NUL password`; authzid must be empty or the user."""
    parts = payload.split(b"\x00")
    if len(parts) != 3:
        raise AuthFailed("PLAIN message must be authzid\\0user\\0password")
    authzid, name, password = (p.decode("utf-8", "replace") for p in parts)
    user = users.get(name)
    if user is None or (authzid and authzid != name) or not user.check_password(password):
        raise BadCredentials(f"PLAIN: bad user or password for {name!r}")
    return user


def _attributes(message: str) -> list[tuple[str, str]]:
    """Split `a=1,b=2` into pairs. Values may contain '=' (base64) but not ','."""
    out = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise AuthFailed(f"malformed SCRAM attribute {part[:20]!r}")
        out.append((part[0], part[2:]))
    return out


def _unescape_name(name: str) -> str:
    # RFC 5802: ',' and '=' in user names travel as =2C and =3D; any other '=' is an error.
    out = name.replace("=2C", ",").replace("=3D", "=")
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise AuthFailed("user name has an invalid '=' escape")
    return out


class ScramServer:
    """One SCRAM exchange (RFC 5802 section 5): client-first -> server-first -> client-final ->
    server-final. No channel binding: a client that asks for it ('p=') is refused."""

    def __init__(self, users: UserDB, algorithm: str, nonce: bytes | None = None):
        self.users = users
        self.algorithm = algorithm
        self._nonce = _b64(nonce if nonce is not None else os.urandom(18))
        self.user: User | None = None
        self._username = ""
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._combined_nonce = ""
        self._credential: ScramCredential | None = None

    def start(self, client_first: bytes) -> bytes:
        try:
            text = client_first.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("client-first message is not UTF-8") from None
        # gs2-header = cbind-flag "," [authzid] ","
        flag, sep1, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not (sep1 and sep2) or flag not in ("n", "y"):
            raise AuthFailed(f"unsupported SCRAM gs2 header {text[:8]!r} (channel binding is not offered)")
        if authzid and not authzid.startswith("a="):
            raise AuthFailed("malformed authzid in the gs2 header")
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        # The official SDK's nonce may contain spaces: r= runs to the next comma, whatever it holds.
        attrs = dict(_attributes(bare))
        if "m" in attrs:
            raise AuthFailed("SCRAM mandatory extensions are not supported")
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise AuthFailed("client-first message needs n= and r=")
        self._username = _unescape_name(attrs["n"])
        if authzid and _unescape_name(authzid[2:]) != self._username:
            raise AuthFailed("authzid differs from the user name")
        self.user = self.users.get(self._username)
        cred = self.user.credential(self.algorithm) if self.user is not None else None
        self._credential = cred
        salt, iterations = (cred.salt, cred.iterations) if cred else (self.users.fake_salt(self._username),
                                                                       DEFAULT_ITERATIONS)
        self._combined_nonce = attrs["r"] + self._nonce
        self._server_first = f"r={self._combined_nonce},s={_b64(salt)},i={iterations}"
        return self._server_first.encode()

    @property
    def username(self) -> str:
        """The user name the client gave (known once `start` parsed it; "" before)."""
        return self._username

    def step(self, client_final: bytes) -> bytes:
        """Verify the proof; return the server-final message `v=<signature>`."""
        try:
            text = client_final.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("client-final message is not UTF-8") from None
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise AuthFailed("client-final message has no proof")
        attrs = dict(_attributes(without_proof))
        if _unb64(attrs.get("c", "")) != self._gs2_header.encode():
            raise AuthFailed("channel-binding data does not repeat the gs2 header")
        if attrs.get("r") != self._combined_nonce:
            raise AuthFailed("nonce mismatch")
        if self._credential is None or self.user is None:
            raise BadCredentials(f"unknown user {self._username!r}")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        proof = _unb64(proof_b64)
        for stored_key, server_key in self._credential.keys:
            signature = hmac.digest(stored_key, auth_message, self.algorithm)
            if len(proof) != len(signature):
                break
            client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
            if hmac.compare_digest(hashlib.new(self.algorithm, client_key).digest(), stored_key):
                return b"v=" + _b64(hmac.digest(server_key, auth_message, self.algorithm)).encode()
        raise BadCredentials(f"wrong password for {self._username!r}")
