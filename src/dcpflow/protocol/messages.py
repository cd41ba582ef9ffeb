"""One dispatch table for every typed message of the protocol package (DCP, KV, *WithMeta,
sub-document, range scans)."""

from . import dcp, kv, meta, range_scan, subdoc
from .errors import ProtocolError
from .frame import Frame, Magic
from .status import Status

REQUEST_TYPES: dict[int, type] = {**kv.REQUEST_TYPES, **meta.REQUEST_TYPES, **dcp.REQUEST_TYPES,
                                  **subdoc.REQUEST_TYPES, **range_scan.REQUEST_TYPES}
RESPONSE_TYPES: dict[int, type] = {**kv.RESPONSE_TYPES, **meta.RESPONSE_TYPES, **dcp.RESPONSE_TYPES,
                                   **subdoc.RESPONSE_TYPES, **range_scan.RESPONSE_TYPES}
#: Replies that carry a typed body under statuses other than SUCCESS (a multi-path partial failure,
#: a sub-document success on a tombstone, a range scan's last frame).
_BODY_STATUSES: dict[int, frozenset] = {
    **{op: subdoc.SINGLE_BODY_STATUSES for op in subdoc.SINGLE_OPCODES},
    subdoc.Opcode.SUBDOC_MULTI_LOOKUP: subdoc.LOOKUP_BODY_STATUSES,
    subdoc.Opcode.SUBDOC_MULTI_MUTATION: subdoc.MUTATION_BODY_STATUSES,
    range_scan.Opcode.RANGE_SCAN_CONTINUE: range_scan.CONTINUE_DATA_STATUSES,
}


def decode_message(frame: Frame):
    """The typed message of any frame this package knows; ProtocolError if it breaks a rule or is
    unknown (UNKNOWN_COMMAND). Error responses keep their body (text, error context, or the cluster
    map of NOT_MY_VBUCKET) as `kv.RawResponse`."""
    if frame.magic in (Magic.SERVER_REQUEST, Magic.SERVER_RESPONSE):
        raise ProtocolError(f"magic 0x{frame.magic:02x} is a duplex server command",
                            Status.UNKNOWN_COMMAND, opcode=frame.opcode, opaque=frame.opaque, magic=frame.magic)
    if frame.is_response and frame.opcode in dcp.RESPONSE_TYPES:
        return dcp.RESPONSE_TYPES[frame.opcode].from_frame(frame)  # these type their error statuses too
    if frame.is_response and frame.status in _BODY_STATUSES.get(frame.opcode, ()):
        return RESPONSE_TYPES[frame.opcode].from_frame(frame)
    return kv.decode_kv(frame, (REQUEST_TYPES, RESPONSE_TYPES))
