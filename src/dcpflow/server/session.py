"""Session commands: HELLO, SASL, SELECT_BUCKET, LIST_BUCKETS, GET_CLUSTER_CONFIG, GET_ERROR_MAP,
VERSION, NOOP, QUIT - what a client sends before (and beside) KV traffic.

Pages: BinaryProtocol.md (#0x1f-helo, #0x89-select-bucket, #0xb5-get-cluster-config,
#0xfe-get-error-map, #0x0b-version, #0x0a-no-op, #0x07-quit), docs/sasl.md, docs/ErrorMap.md.
"""

import math

from dcpflow.protocol import error_map
from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.config import parse_cluster_map
from dcpflow.protocol.datatype import Datatype
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, response
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .audit import AUTHENTICATION_FAILED
from .auth import MECHANISMS, SCRAM_MECHANISMS, AuthFailed, BadCredentials, Privilege, ScramServer, plain_authenticate
from .connection import Connection

#: What the server version answers; the official SDKs enable features by it, so it must look like a
#: real server's `X.Y.Z-build`.
SERVER_VERSION = "7.6.0-0000"

#: HELLO features this server implements; `kv.negotiate` grants the requested subset of these.
SUPPORTED_FEATURES = frozenset({
    Feature.TCP_NODELAY,  # always on
    Feature.MUTATION_SEQNO,  # mutation replies carry (vbucket uuid, seqno)
    Feature.XATTR,  # values may carry xattrs (*WithMeta); GET returns the body without them
    Feature.XERROR,  # error replies carry a JSON context; new codes are sent as they are
    Feature.SELECT_BUCKET,
    Feature.JSON,  # the JSON datatype bit is kept and returned
    Feature.ALT_REQUEST_SUPPORT,  # magic 0x08 (framing extras) is decoded
    Feature.COLLECTIONS,  # keys carry the LEB128 collection id of any collection of the manifest
    Feature.PRESERVE_TTL,  # the preserve-TTL frame on SET/REPLACE keeps the document's expiry
    Feature.SNAPPY,  # values may arrive Snappy-compressed (kv.inflate); they are stored and served inflated
    Feature.GET_CLUSTER_CONFIG_WITH_KNOWN_VERSION,
    Feature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP,
    # sub-document (subdoc.py): virtual xattrs, CREATE_AS_DELETED, ${$document} macros,
    # REPLACE_BODY_WITH_XATTR, REPLICA_READ, several xattr keys per request, BINARY_VALUE
    Feature.VATTR,
    Feature.SUBDOC_CREATE_AS_DELETED,
    Feature.SUBDOC_DOCUMENT_MACRO_SUPPORT,
    Feature.SUBDOC_REPLACE_BODY_WITH_XATTR,
    Feature.SUBDOC_REPLICA_READ,
    Feature.SUBDOC_ALLOWS_ACCESS_ON_MULTIPLE_XATTR_KEYS,
    Feature.SUBDOC_BINARY_XATTR,
    Feature.RANGE_SCAN_INCLUDE_XATTR,  # range scans may return documents with their xattrs (range_scan.py)
    Feature.SYNC_REPLICATION,  # durability requirements on mutations (durable.py)
    Feature.UNORDERED_EXECUTION,  # later requests may overtake a durable write that waits (connection.py)
})


def hello(conn: Connection, frame: Frame) -> bytes:
    """HELLO replaces the connection's feature set with the subset of the request we implement."""
    req = kvproto.Hello.from_frame(frame)
    conn.agent = req.agent_name
    conn.client_id = req.connection_id
    granted = kvproto.negotiate(req.features, SUPPORTED_FEATURES)
    conn.set_features(granted)
    return kvproto.HelloResponse(granted, frame.opaque).encode()


def mechanisms(conn: Connection) -> tuple[str, ...]:
    """What this connection may use: PLAIN puts the password on the wire, so only inside TLS (or
    when the server was told `plain_over_tcp`), as Couchbase Server does."""
    if conn.tls or conn.server.config.plain_over_tcp:
        return MECHANISMS
    return tuple(SCRAM_MECHANISMS)


def sasl_list_mechs(conn: Connection, frame: Frame) -> bytes:
    kvproto.SaslListMechs.from_frame(frame)
    return kvproto.SaslListMechsResponse(mechanisms(conn), frame.opaque).encode()


def _sasl_failed(conn: Connection, frame: Frame, why: str, public: bool = False, user: str = "",
                 mechanism: str = "", guess: bool = False) -> bytes:
    """Credentials problems get the generic context (no user enumeration); `public` reasons (a
    mechanism this connection may not use, a lockout) are told to the client so it can act on them.
    Every failure is audited (authentication failed) with the user the client named and the real
    reason; a wrong `guess` (bad credentials) also counts for the login throttle (throttle.py)."""
    conn.audit(AUTHENTICATION_FAILED, user=user, reason=why, mechanism=mechanism)
    if guess:
        conn.server.throttle.failed(conn.peer_ip, user)
    conn.sasl = None
    conn.set_user(None)
    return conn.error_reply(frame.opcode, frame.opaque, Status.AUTH_ERROR, why if public else "Authentication failed")


def _locked_out(conn: Connection, frame: Frame, user: str, mechanism: str) -> bytes | None:
    """AUTH_ERROR, without a look at the credentials, while failed logins lock out this address
    or (for an address that failed as it) this user (throttle.py); None if the attempt may go on."""
    wait = conn.server.throttle.check(conn.peer_ip, user)
    if not wait:
        return None
    return _sasl_failed(conn, frame, f"too many failed logins from this address or as this user: try again in "
                        f"{math.ceil(wait)} s", public=True, user=user, mechanism=mechanism)


def sasl_auth(conn: Connection, frame: Frame) -> bytes:
    """Start an exchange: PLAIN completes at once, SCRAM answers AUTH_CONTINUE with server-first."""
    req = kvproto.SaslAuth.from_frame(frame)
    mech = req.mechanism.decode("ascii", "replace")
    conn.sasl = None
    exchange = None
    try:
        if mech == "PLAIN":
            if "PLAIN" not in mechanisms(conn):
                return _sasl_failed(conn, frame, "PLAIN is offered only over TLS: use SCRAM-SHA512, the TLS "
                                    "port, or start the server with --allow-plain-over-tcp", public=True,
                                    user=_plain_user(req.payload), mechanism=mech)
            locked = _locked_out(conn, frame, _plain_user(req.payload), mech)
            if locked is not None:
                return locked
            user = plain_authenticate(conn.server.users, req.payload)
            return _authenticated(conn, frame, user, response(frame.opcode, opaque=frame.opaque))
        algorithm = SCRAM_MECHANISMS.get(mech)
        if algorithm is None:
            return _sasl_failed(conn, frame, f"unknown mechanism {mech!r} (we offer {' '.join(mechanisms(conn))})",
                                public=True, mechanism=mech)
        exchange = ScramServer(conn.server.users, algorithm)
        server_first = exchange.start(req.payload)
    except AuthFailed as e:
        user = exchange.username if exchange is not None else _plain_user(req.payload)
        return _sasl_failed(conn, frame, str(e), user=user, mechanism=mech, guess=isinstance(e, BadCredentials))
    locked = _locked_out(conn, frame, exchange.username, mech)
    if locked is not None:
        return locked
    conn.sasl = (mech, exchange)
    return kvproto.SaslResponse(server_first, Status.AUTH_CONTINUE, frame.opaque, frame.opcode).encode()


def sasl_step(conn: Connection, frame: Frame) -> bytes:
    req = kvproto.SaslAuth.from_frame(frame)
    mech = req.mechanism.decode("ascii", "replace")
    if conn.sasl is None or conn.sasl[0] != mech:
        return _sasl_failed(conn, frame, f"SASL_STEP for {mech!r} without a matching SASL_AUTH", mechanism=mech)
    exchange = conn.sasl[1]
    conn.sasl = None
    locked = _locked_out(conn, frame, exchange.username, mech)  # (locked since the exchange began)
    if locked is not None:
        return locked
    try:
        server_final = exchange.step(req.payload)
    except AuthFailed as e:
        return _sasl_failed(conn, frame, str(e), user=exchange.username, mechanism=mech,
                            guess=isinstance(e, BadCredentials))
    return _authenticated(conn, frame, exchange.user,
                          kvproto.SaslResponse(server_final, Status.SUCCESS, frame.opaque, frame.opcode).encode())


def _authenticated(conn: Connection, frame: Frame, user, reply: bytes) -> bytes | None:
    """The user proved who they are (the throttle forgets this address's failures as them). With
    max_connections connections already authenticated as ordinary users, only an administrator or
    the cluster manager stays (the reserve): anyone else hears ETMPFAIL and is disconnected, as
    kv_engine keeps its system connections."""
    conn.server.throttle.succeeded(conn.peer_ip, user.name)
    if not conn.server.may_stay(conn, user):
        conn.set_user(user)
        conn.server.refuse_reserved(conn)
        conn.writer.write(conn.error_reply(frame.opcode, frame.opaque, Status.ETMPFAIL,
                                           "the server is at its connection limit: try again later"))
        conn.close()
        return None
    conn.set_user(user)
    return reply


def _plain_user(payload: bytes) -> str:
    """The user a PLAIN message names (`authzid NUL user NUL password`), for the audit trail."""
    parts = payload.split(b"\x00")
    return parts[1].decode("utf-8", "replace") if len(parts) == 3 else ""


def select_bucket(conn: Connection, frame: Frame) -> bytes:
    """Bind the connection to a bucket; "@no bucket@" unbinds it. A bucket the user has no role on
    answers EACCESS whether or not it exists (so users cannot probe for bucket names)."""
    req = kvproto.SelectBucket.from_frame(frame)
    if req.name == kvproto.NO_BUCKET_NAME:
        conn.select_bucket(None)
        return response(frame.opcode, opaque=frame.opaque)
    name = req.name.decode("utf-8", "replace")
    if not conn.user.may_access(name):
        return conn.access_refused(frame, f"no access to bucket {name!r}", bucket=name)
    bucket = conn.server.buckets.get(name)
    if bucket is None:
        return conn.error_reply(frame.opcode, frame.opaque, Status.KEY_ENOENT, f"no bucket named {name!r}")
    conn.select_bucket(bucket)
    return response(frame.opcode, opaque=frame.opaque)


def list_buckets(conn: Connection, frame: Frame) -> bytes:
    kvproto.ListBuckets.from_frame(frame)
    names = tuple(n for n in conn.server.buckets if conn.user.may_access(n))
    return kvproto.ListBucketsResponse(names, frame.opaque).encode()


def get_cluster_config(conn: Connection, frame: Frame) -> bytes:
    """The selected bucket's map, or the cluster-level map with no bucket selected. With a known
    version in the extras, the map is sent only if ours is newer (empty success otherwise)."""
    req = kvproto.GetClusterConfig.from_frame(frame)
    version = conn.server.topology.version
    # The known configuration (NOT_MY_VBUCKET dedupe) is the selected bucket's map: recorded when
    # the client gets it or says it has it, never for the cluster-level map (it has no vbuckets).
    if req.known_version is not None and req.known_version >= version:
        if conn.bucket is not None:
            conn.known_config = version
        return response(frame.opcode, opaque=frame.opaque)
    if conn.bucket is None:
        return response(frame.opcode, opaque=frame.opaque, value=conn.server.topology.cluster_config(),
                        datatype=Datatype.JSON)
    conn.known_config = version
    return response(frame.opcode, opaque=frame.opaque, value=conn.bucket.config(), datatype=Datatype.JSON)


def set_cluster_config(conn: Connection, frame: Frame) -> bytes:
    """SET_CLUSTER_CONFIG 0xb4: the cluster manager pushes a bucket's map (key = bucket name, value =
    the map JSON, extras = its epoch and revision as two i64s). Every node then serves that map, with
    its own entry marked thisNode, to GET_CLUSTER_CONFIG and in NOT_MY_VBUCKET replies; a version not
    newer than the current one is ignored. Needs the cluster manager's privilege on the bucket."""
    if len(frame.extras) != 16 or not frame.key or not frame.value or frame.cas:
        return conn.error_reply(frame.opcode, frame.opaque, Status.EINVAL, "SET_CLUSTER_CONFIG needs 16 bytes of "
                                "extras (epoch, revision), the bucket name as key and the map as value")
    name = frame.key.decode("utf-8", "replace")
    if not conn.user.privileges(name) & Privilege.NODE_MANAGEMENT:
        return conn.access_refused(frame, f"user {conn.user.name!r} may not set the cluster map of {name!r}",
                                   bucket=name)
    bucket = conn.server.buckets.get(name)
    if bucket is None:
        return conn.error_reply(frame.opcode, frame.opaque, Status.KEY_ENOENT, f"no bucket named {name!r}")
    req = kvproto.SetClusterConfig.from_frame(frame)  # the checks above leave it nothing to refuse
    epoch, rev = req.epoch, req.revision
    try:
        cmap = parse_cluster_map(frame.value)
    except ProtocolError as e:
        return conn.error_reply(frame.opcode, frame.opaque, Status.EINVAL, f"unusable map: {e.reason}")
    if cmap.version != (epoch, rev) or not cmap.vbucket_map or cmap.name not in (None, name):
        return conn.error_reply(frame.opcode, frame.opaque, Status.EINVAL, f"the map's (revEpoch, rev) "
                                f"{cmap.version} and name {cmap.name!r} must match the extras {(epoch, rev)} "
                                f"and the key {name!r}, and it needs a vBucketMap")
    if cmap.num_vbuckets != bucket.engine.num_vbuckets:
        return conn.error_reply(frame.opcode, frame.opaque, Status.EINVAL, f"the map has {cmap.num_vbuckets} "
                                f"vbuckets; bucket {name!r} has {bucket.engine.num_vbuckets}")
    if conn.server.topology.adopt(name, list(cmap.nodes), conn.server.port, cmap.vbucket_map, cmap.num_replicas,
                                  cmap.version, (cmap.cluster_name, cmap.cluster_uuid)) and cmap.uuid:
        bucket.uuid = cmap.uuid  # one bucket, one uuid, whichever node a client asks
    return response(frame.opcode, opaque=frame.opaque)


def get_error_map(conn: Connection, frame: Frame) -> bytes:
    req = kvproto.GetErrorMap.from_frame(frame)
    data = conn.server.error_map(min(req.version, error_map.MAX_VERSION))
    return kvproto.ErrorMapResponse(data, frame.opaque).encode()


def version(conn: Connection, frame: Frame) -> bytes:
    kvproto.Version.from_frame(frame)
    return kvproto.VersionResponse(SERVER_VERSION, frame.opaque).encode()


def noop(conn: Connection, frame: Frame) -> bytes:
    kvproto.Noop.from_frame(frame)
    return response(frame.opcode, opaque=frame.opaque)


def quit_(conn: Connection, frame: Frame) -> None:
    req = kvproto.Quit.from_frame(frame)
    if req.opcode == Opcode.QUIT:
        conn.writer.write(response(frame.opcode, opaque=frame.opaque))
    conn.close()
    return None
