"""The command table: every request opcode the server answers, its handler, and what the session
must have before the handler runs.

The connection looks the opcode up and checks, in this order: the document key of a command
that carries one (EINVAL: kv_engine validates a request before it checks who sent it), an
authenticated user (else EACCESS), a selected bucket (else NO_BUCKET), the privileges on that
bucket (else EACCESS: https://github.com/couchbase/kv_engine/blob/master/docs/rbac.md); then it
calls `handler(conn, frame)` (dispatch.py says what a handler returns). An opcode missing here is
UNKNOWN_COMMAND. This is the one place that wires handlers in: the handler modules register
nothing themselves.
"""

from collections.abc import Iterable

from dcpflow.protocol import kv as kvproto
from dcpflow.protocol import meta as metaproto
from dcpflow.protocol import subdoc as sdproto
from dcpflow.protocol.opcodes import Opcode

from . import dcp_commands as dcp
from . import kv, range_scan, session, stats, subdoc
from .auth import Privilege as P
from .dispatch import Command, Handler

_SESSION = {"auth": False, "bucket": False}  # before SASL: HELLO, SASL, error map, version, noop, quit


def _entry(opcodes: Iterable[int], handler: Handler, *, auth: bool = True, bucket: bool = True,
           privilege: P = P.NONE, key: bool = False) -> tuple[tuple[int, ...], Command]:
    return tuple(opcodes), Command(handler, auth, bucket, int(privilege), key)


def build(entries: Iterable[tuple[tuple[int, ...], Command]]) -> dict[int, Command]:
    """The table of `entries`; an opcode listed twice is a mistake (RuntimeError)."""
    table: dict[int, Command] = {}
    for opcodes, cmd in entries:
        for op in opcodes:
            if op in table:
                raise RuntimeError(f"opcode 0x{op:02x} is in the command table twice")
            table[int(op)] = cmd
    return table


#: What a connection that runs its requests in order does with the requests buffered behind one
#: that waits (Connection.read_ahead): GETs of documents on disk start their reads (kv.read_ahead).
READ_AHEAD = kv.read_ahead

COMMANDS: dict[int, Command] = build([
    # the session (session.py): HELLO, SASL, buckets, cluster map, error map
    _entry([Opcode.HELLO], session.hello, **_SESSION),
    _entry([Opcode.SASL_LIST_MECHS], session.sasl_list_mechs, **_SESSION),
    _entry([Opcode.SASL_AUTH], session.sasl_auth, **_SESSION),
    _entry([Opcode.SASL_STEP], session.sasl_step, **_SESSION),
    _entry([Opcode.SELECT_BUCKET], session.select_bucket, bucket=False),
    _entry([Opcode.LIST_BUCKETS], session.list_buckets, bucket=False),
    _entry([Opcode.GET_CLUSTER_CONFIG], session.get_cluster_config, bucket=False),
    _entry([Opcode.SET_CLUSTER_CONFIG], session.set_cluster_config, bucket=False),
    _entry([Opcode.GET_ERROR_MAP], session.get_error_map, **_SESSION),
    _entry([Opcode.VERSION], session.version, **_SESSION),
    _entry([Opcode.NOOP], session.noop, **_SESSION),
    _entry([Opcode.QUIT, Opcode.QUIT_Q], session.quit_, **_SESSION),
    _entry([Opcode.STAT], stats.stat, bucket=False),
    # documents (kv.py)
    _entry(kvproto.Get.OPCODES, kv.get, privilege=P.READ, key=True),
    _entry(kvproto.Store.OPCODES, kv.store, privilege=P.WRITE, key=True),
    _entry(kvproto.Delete.OPCODES, kv.delete, privilege=P.WRITE, key=True),
    _entry([Opcode.TOUCH], kv.touch, privilege=P.WRITE, key=True),
    _entry(kvproto.Gat.OPCODES, kv.get_and_touch, privilege=P.READ | P.WRITE, key=True),
    _entry([Opcode.GET_LOCKED], kv.get_locked, privilege=P.READ, key=True),
    _entry([Opcode.UNLOCK_KEY], kv.unlock_key, privilege=P.READ, key=True),
    _entry([Opcode.GET_REPLICA], kv.get_replica, privilege=P.READ, key=True),
    _entry(kvproto.Arithmetic.OPCODES, kv.arithmetic, privilege=P.READ | P.WRITE, key=True),
    _entry(kvproto.Concat.OPCODES, kv.concat, privilege=P.WRITE, key=True),
    _entry(metaproto.GetMeta.OPCODES, kv.get_meta, privilege=P.META_READ, key=True),
    _entry(metaproto.SetWithMeta.OPCODES, kv.set_with_meta, privilege=P.META_WRITE, key=True),
    _entry(metaproto.DelWithMeta.OPCODES, kv.del_with_meta, privilege=P.META_WRITE, key=True),
    # sub-document lookups and mutations (subdoc.py)
    _entry(sdproto.LOOKUP_OPCODES, subdoc.lookup_single, privilege=P.READ, key=True),
    _entry(sdproto.MUTATION_OPCODES, subdoc.mutation_single, privilege=P.WRITE, key=True),
    _entry([Opcode.SUBDOC_MULTI_LOOKUP], subdoc.multi_lookup, privilege=P.READ, key=True),
    _entry([Opcode.SUBDOC_MULTI_MUTATION], subdoc.multi_mutation, privilege=P.WRITE, key=True),
    # KV range scans (range_scan.py)
    _entry([Opcode.RANGE_SCAN_CREATE], range_scan.create, privilege=P.READ),
    _entry([Opcode.RANGE_SCAN_CONTINUE], range_scan.continue_, privilege=P.READ),
    _entry([Opcode.RANGE_SCAN_CANCEL], range_scan.cancel, privilege=P.READ),
    # vbuckets, seqnos and persistence (kv.py)
    _entry([Opcode.GET_ALL_VB_SEQNOS], kv.get_all_vb_seqnos, privilege=P.META_READ),
    _entry([Opcode.GET_FAILOVER_LOG], kv.get_failover_log, privilege=P.META_READ),
    _entry([Opcode.OBSERVE_SEQNO], kv.observe_seqno, privilege=P.META_READ),
    _entry([Opcode.SET_VBUCKET], kv.set_vbucket, privilege=P.NODE_MANAGEMENT),
    _entry([Opcode.GET_VBUCKET], kv.get_vbucket, privilege=P.META_READ),
    _entry([Opcode.STOP_PERSISTENCE], kv.stop_persistence, privilege=P.NODE_MANAGEMENT),
    _entry([Opcode.START_PERSISTENCE], kv.start_persistence, privilege=P.NODE_MANAGEMENT),
    _entry([Opcode.SEQNO_PERSISTENCE], kv.seqno_persistence),
    # collections: the manifest and id lookups (kv.py)
    _entry([Opcode.COLLECTIONS_GET_MANIFEST], kv.get_collections_manifest),
    _entry([Opcode.COLLECTIONS_GET_ID], kv.get_collection_id),
    _entry([Opcode.COLLECTIONS_GET_SCOPE_ID], kv.get_scope_id),
    # DCP (dcp_commands.py): DCP_OPEN picks the role; CLOSE_STREAM and NOOP serve both roles,
    # so the role's privilege is checked by the handler
    _entry([Opcode.DCP_OPEN], dcp.dcp_open),
    _entry([Opcode.DCP_CONTROL], dcp.dcp_control),
    _entry([Opcode.DCP_STREAM_REQ], dcp.dcp_stream_req, privilege=P.DCP_PRODUCER),
    _entry([Opcode.DCP_CLOSE_STREAM], dcp.dcp_close_stream),
    _entry([Opcode.DCP_GET_FAILOVER_LOG], dcp.dcp_get_failover_log),
    _entry([Opcode.DCP_BUFFER_ACKNOWLEDGEMENT], dcp.dcp_buffer_ack),
    _entry([Opcode.DCP_SEQNO_ACKNOWLEDGED], dcp.dcp_seqno_ack),
    _entry([Opcode.DCP_NOOP], dcp.dcp_noop),
    _entry([Opcode.DCP_ADD_STREAM], dcp.dcp_add_stream, privilege=P.DCP_CONSUMER),
    _entry([Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_MUTATION, Opcode.DCP_DELETION, Opcode.DCP_EXPIRATION,
            Opcode.DCP_STREAM_END, Opcode.DCP_SET_VBUCKET_STATE, Opcode.DCP_SEQNO_ADVANCED, Opcode.DCP_SYSTEM_EVENT,
            Opcode.DCP_PREPARE, Opcode.DCP_COMMIT, Opcode.DCP_ABORT],
           dcp.dcp_stream_message, privilege=P.DCP_CONSUMER),
])
