"""Dispatch from opcode to message type (decode_dcp), the in-place readers of a stream's control
frames, the batch decoder DcpDecoder and the flow-control charge of each message.
"""


from .. import rules
from ..errors import ProtocolError
from ..frame import (
    HEADER,
    HEADER_LEN,
    Frame,
    FrameDecoder,
    Magic,
)
from ..kv import RawResponse
from ..opcodes import Opcode
from ..status import Status
from . import streams
from .cache_transfer import DcpCacheTransfer, DcpCacheTransferEnd
from .control import DcpBufferAck, DcpControl, DcpNoop, DcpOpen
from .documents import DcpDeletion, DcpExpiration, DcpMutation
from .events import DcpSetVbucketState, DcpSystemEvent
from .flags import MarkerVersion, SnapshotFlag
from .layouts import (
    _DEL1_FAST,
    _DEL2_FAST,
    _MARKER_FAST,
    _MARKER_V1,
    _MARKER_V20,
    _MARKER_V22_44,
    _MUT_FAST,
    _U32,
    MARKER_V2_VALUE_BYTES,
    MARKER_V22_SHORT,
)
from .snapshots import DcpOsoSnapshot, DcpSeqnoAdvanced, DcpSnapshotMarker
from .streams import DcpStreamEnd
from .sync_writes import DcpAbort, DcpCommit, DcpPrepare, DcpSeqnoAcknowledged

# ---------------------------------------------------------------------------------------------
# Dispatch

#: Request opcode -> message type, for decoding anything that arrives on a DCP connection.
REQUEST_TYPES: dict[int, type] = {
    cls.opcode: cls for cls in (
        DcpOpen, streams.DcpAddStream, streams.DcpCloseStream, streams.DcpStreamRequest,
        streams.DcpGetFailoverLog, DcpStreamEnd,
        DcpSnapshotMarker, DcpMutation, DcpDeletion, DcpExpiration, DcpSetVbucketState, DcpNoop,
        DcpBufferAck, DcpControl, DcpSystemEvent, DcpPrepare, DcpSeqnoAcknowledged, DcpCommit, DcpAbort,
        DcpSeqnoAdvanced, DcpOsoSnapshot, DcpCacheTransfer, DcpCacheTransferEnd)
}

#: The messages a producer sends on a stream (stream-end.md .. cache-transfer-end), as opposed to the
#: connection-level ones (noop, buffer acknowledgement, control, seqno acknowledged) and
#: DCP_SET_VBUCKET_STATE, which the consumer answers.
STREAM_OPCODES = frozenset({
    Opcode.DCP_STREAM_END, Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_MUTATION, Opcode.DCP_DELETION,
    Opcode.DCP_EXPIRATION, Opcode.DCP_FLUSH, Opcode.DCP_SYSTEM_EVENT, Opcode.DCP_PREPARE, Opcode.DCP_COMMIT,
    Opcode.DCP_ABORT, Opcode.DCP_SEQNO_ADVANCED, Opcode.DCP_OSO_SNAPSHOT, Opcode.DCP_CACHE_TRANSFER,
    Opcode.DCP_CACHE_TRANSFER_END})

#: Response opcode -> message type, where the response has a body worth typing.
RESPONSE_TYPES: dict[int, type] = {
    Opcode.DCP_STREAM_REQ: streams.DcpStreamRequestResponse,
    Opcode.DCP_GET_FAILOVER_LOG: streams.FailoverLogResponse,
    Opcode.GET_FAILOVER_LOG: streams.FailoverLogResponse,
    Opcode.DCP_ADD_STREAM: streams.DcpAddStreamResponse,
}


def decode_dcp(frame: Frame):
    """The typed message for a frame seen on a DCP connection (raises ProtocolError if malformed)."""
    if frame.magic in (Magic.SERVER_REQUEST, Magic.SERVER_RESPONSE):
        raise ProtocolError(f"magic 0x{frame.magic:02x} is a duplex server command, not a DCP message",
                            Status.UNKNOWN_COMMAND, opcode=frame.opcode, opaque=frame.opaque, magic=frame.magic)
    if frame.is_response:
        return RESPONSE_TYPES.get(frame.opcode, RawResponse).from_frame(frame)
    cls = REQUEST_TYPES.get(frame.opcode)
    if cls is None:
        rules.check(frame)
        raise ProtocolError(f"opcode {rules.opcode_name(frame.opcode)} is not a DCP message",
                            Status.UNKNOWN_COMMAND, opcode=frame.opcode, opaque=frame.opaque)
    return cls.from_frame(frame)


# -- the control frames of a stream, read in place -----------------------------------------------
# Every stream brings a snapshot marker and a stream end, so where vbuckets hold few documents the
# full decode (a Frame, the rules, a typed message) of those two is a sizeable part of a columnar
# reader's work. These read the canonical shape in place and answer None for anything else, which
# decode_dcp then accepts or rejects with its own words: what they accept, it accepts the same.

_HEAD = HEADER.unpack_from
_MARKER_FLAGS = int(sum(SnapshotFlag))
_MEMORY_DISK = int(SnapshotFlag.MEMORY | SnapshotFlag.DISK)


def marker_fields(data, p: int) -> tuple[int, int, int] | None:
    """(start, end, purge seqno) of the snapshot marker whose whole frame is at `p`: classic
    framing, no key, datatype 0, V1 (20-byte extras) or V2.0/V2.2 (version byte and its value;
    the purge seqno is V2.2's, else 0), start <= end, known flags and not both Memory and Disk
    (snapshot-marker.md); else None."""
    magic, opcode, klen, ext, datatype, _, body, _, _ = _HEAD(data, p)
    if magic != Magic.REQUEST or opcode != Opcode.DCP_SNAPSHOT_MARKER or klen or datatype:
        return None
    at = p + HEADER_LEN
    if ext == _MARKER_V1.size and body == ext:
        start, end, flags = _MARKER_V1.unpack_from(data, at)
        purge = 0
    elif ext == 1 and body > 1 and (body - 1 == MARKER_V2_VALUE_BYTES.get(data[at]) or
                                    (data[at] == MarkerVersion.V2_2 and body - 1 == MARKER_V22_SHORT)):
        if data[at] == MarkerVersion.V2_2:
            start, end, flags, _, _, purge = _MARKER_V22_44.unpack_from(data, at + 1)
        else:
            start, end, flags, _, _ = _MARKER_V20.unpack_from(data, at + 1)
            purge = 0
    else:
        return None
    if start > end or flags & ~_MARKER_FLAGS or flags & _MEMORY_DISK == _MEMORY_DISK:
        return None
    return start, end, purge


def stream_end_reason(data, p: int) -> int | None:
    """The reason of the stream end whose whole frame is at `p`: classic framing, 4-byte extras,
    no key or value, datatype 0 (stream-end.md); else None."""
    magic, opcode, klen, ext, datatype, _, body, _, _ = _HEAD(data, p)
    if (magic != Magic.REQUEST or opcode != Opcode.DCP_STREAM_END or klen or datatype or ext != _U32.size
            or body != ext):
        return None
    return _U32.unpack_from(data, p + HEADER_LEN)[0]


_tn = tuple.__new__


class DcpDecoder(FrameDecoder):
    """A FrameDecoder that yields typed DCP messages.

    The three messages that make up nearly all stream traffic (mutation, deletion, V1 snapshot
    marker) in classic framing are decoded straight from the buffer with one fused header+extras
    unpack and no intermediate Frame; everything else goes through Frame and `decode_dcp`, so the
    rules are the same for both paths.
    """

    __slots__ = ()

    def messages(self):
        """Yield every complete message now buffered (same contract as `frames()`)."""
        while True:
            if self._broken is not None:
                raise self._broken
            if self._chunks is None:
                buf, pos = self._buf, self._pos
                end = len(buf)
                limit = HEADER_LEN + self.max_body_len
                mut, del2, del1, marker = _MUT_FAST, _DEL2_FAST, _DEL1_FAST, _MARKER_FAST
                mutation, deletion, snapshot = DcpMutation, DcpDeletion, DcpSnapshotMarker
                while end - pos >= 44 and buf[pos] == 0x80:
                    op, ext = buf[pos + 1], buf[pos + 4]
                    if op == 0x57 and ext == 31 and end - pos >= 55:
                        klen, dt, vb, blen, opaque, cas, seq, rev, flags, exp, lock, nru = mut(buf, pos)
                        k = pos + 55
                        v = k + klen
                        fend = pos + 24 + blen
                        if not (v <= fend <= end and klen and fend - pos <= limit and buf[pos + 52] == 0
                                and buf[pos + 53] == 0):
                            break
                        self._pos = pos = fend
                        yield _tn(mutation, (vb, seq, rev, flags, exp, lock, buf[k:v], buf[v:fend], cas, dt,
                                             opaque, nru, None))
                    elif op == 0x58 and ext == 21 and end - pos >= 45:
                        klen, dt, vb, blen, opaque, cas, seq, rev, dtime = del2(buf, pos)
                        k = pos + 45
                        v = k + klen
                        fend = pos + 24 + blen
                        if not (v <= fend <= end and klen and fend - pos <= limit):
                            break
                        self._pos = pos = fend
                        yield _tn(deletion, (vb, seq, rev, buf[k:v], buf[v:fend], cas, dt, opaque, dtime, None))
                    elif op == 0x58 and ext == 18:
                        klen, dt, vb, blen, opaque, cas, seq, rev = del1(buf, pos)
                        k = pos + 42
                        v = k + klen
                        fend = pos + 24 + blen
                        if not (v <= fend <= end and klen and fend - pos <= limit and buf[pos + 40] == 0
                                and buf[pos + 41] == 0):
                            break
                        self._pos = pos = fend
                        yield _tn(deletion, (vb, seq, rev, buf[k:v], buf[v:fend], cas, dt, opaque, None, None))
                    elif op == 0x56 and ext == 20 and buf[pos + 2] == 0 and buf[pos + 3] == 0:
                        vb, blen, opaque, start, stop, flags = marker(buf, pos)
                        if not (blen == 20 and start <= stop and not flags & ~0x3F and flags & 3 != 3):
                            break
                        self._pos = pos = pos + 44
                        yield _tn(snapshot, (vb, start, stop, flags, -1, 0, 0, 0, 0, opaque, None))
                    else:
                        break
                    if self._buf is not buf:  # fed while suspended: feed() rebased the buffer
                        break
            # Slow path: one generic frame (or the wait for more bytes), then the fast path again.
            frame = next(self._frames(1), None)  # one frame: the fast loop above takes the rest
            if frame is None:
                return
            yield decode_dcp(frame)


#: Fixed part of each stream message's flow-control charge: header + extras (noops are free).
_CHARGE_BASE = {
    DcpMutation: 55, DcpExpiration: 44, DcpPrepare: 57, DcpCommit: 40, DcpAbort: 40, DcpStreamEnd: 28,
    DcpSetVbucketState: 25, DcpOsoSnapshot: 28, DcpSeqnoAdvanced: 32, DcpSystemEvent: 37,
    DcpCacheTransferEnd: 24,
}
_MARKER_CHARGE = {MarkerVersion.V1: 44, MarkerVersion.V2_0: 61, MarkerVersion.V2_2: 77}


def charged_size(message) -> int:
    """Bytes a producer charges against the flow-control buffer for a message.

    The wire size (header, stream-id frame, extras, key, value), computed without encoding, except
    that a Prepare costs 2 bytes more (MB-46634) and noops are free.
    """
    cls = type(message)
    base = _CHARGE_BASE.get(cls)
    if base is not None:
        size = base + len(getattr(message, "key", b"")) + len(getattr(message, "value", b""))
    elif cls is DcpSnapshotMarker:
        size = _MARKER_CHARGE[message.version]
        if message.version == MarkerVersion.V2_2 and message.high_prepared_seqno is None:
            size -= 8
    elif cls is DcpDeletion:
        size = (42 if message.delete_time is None else 45) + len(message.key) + len(message.value)
    elif cls is DcpNoop:
        return 0
    else:
        return len(message.encode())
    return size + 3 if getattr(message, "stream_id", None) is not None else size
