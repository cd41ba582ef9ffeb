"""Dispatch: opcode -> command type (REQUEST_TYPES / RESPONSE_TYPES) and decode_kv."""

from .. import rules
from ..errors import ProtocolError
from ..frame import Frame
from ..status import Status
from . import reads, server_info, session, stats, vbuckets, writes
from .common import RawResponse

# ---------------------------------------------------------------------------------------------
# Dispatch

#: Request opcode -> command type.
REQUEST_TYPES: dict[int, type] = {}
for _cls in (session.Hello, session.SaslListMechs, session.SelectBucket, session.ListBuckets,
             server_info.GetClusterConfig, server_info.GetErrorMap, server_info.Version, server_info.Noop,
             stats.Stat, reads.Touch, reads.GetReplica, vbuckets.SetVbucket, vbuckets.GetVbucket,
             vbuckets.GetAllVbSeqnos, vbuckets.ObserveSeqno, vbuckets.SeqnoPersistence):
    REQUEST_TYPES[_cls.opcode] = _cls
for _cls in (session.SaslAuth, server_info.Quit, reads.Get, reads.Gat, writes.Store, writes.Delete,
             writes.Arithmetic, writes.Concat):
    for _op in _cls.OPCODES:
        REQUEST_TYPES[_op] = _cls

#: Response opcode -> type of its success (or, for SASL, AUTH_CONTINUE) reply.
RESPONSE_TYPES: dict[int, type] = {}
for _cls in (session.HelloResponse, session.SaslListMechsResponse, session.ListBucketsResponse,
             server_info.ClusterConfigResponse, server_info.ErrorMapResponse, server_info.VersionResponse,
             stats.StatResponse, vbuckets.GetVbucketResponse, vbuckets.GetAllVbSeqnosResponse,
             vbuckets.ObserveSeqnoResponse):
    RESPONSE_TYPES[_cls.opcode] = _cls
for _cls in (session.SaslResponse, writes.MutationResponse, writes.ArithmeticResponse, reads.GetResponse):
    for _op in _cls.OPCODES:
        RESPONSE_TYPES[_op] = _cls
del _op, _cls


def decode_kv(frame: Frame, types: tuple[dict[int, type], dict[int, type]] | None = None):
    """The typed message for a frame of this module (raises ProtocolError if malformed or unknown).

    Responses with an error status, and successes without a typed body (NOOP, SELECT_BUCKET, ...),
    decode as RawResponse, except SASL's AUTH_CONTINUE, which is a step of the exchange. `types` lets
    a caller merge other modules' (REQUEST_TYPES, RESPONSE_TYPES).
    """
    req_types, resp_types = types or (REQUEST_TYPES, RESPONSE_TYPES)
    if frame.is_response:
        cls = resp_types.get(frame.opcode)
        if frame.status == Status.SUCCESS and cls is not None:
            return cls.from_frame(frame)
        if frame.status == Status.AUTH_CONTINUE and frame.opcode in session.SaslAuth.OPCODES:
            return session.SaslResponse.from_frame(frame)
        return RawResponse.from_frame(frame)
    cls = req_types.get(frame.opcode)
    if cls is None:
        rules.check(frame)
        raise ProtocolError(f"opcode {rules.opcode_name(frame.opcode)} has no typed decoder here",
                            Status.UNKNOWN_COMMAND, opcode=frame.opcode, opaque=frame.opaque)
    return cls.from_frame(frame)
