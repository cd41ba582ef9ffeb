"""Snapshot framing of a stream: snapshot-marker.md (V1, V2.0, V2.2), seqno-advanced.md and
oso_snapshot.md.
"""

from typing import NamedTuple

from .. import rules
from ..errors import ProtocolError
from ..frame import (
    Frame,
)
from ..opcodes import Opcode
from ..rules import MAY, Shape
from ..status import Status
from .flags import MarkerVersion, OsoFlag, SnapshotFlag
from .layouts import (
    _MARKER_V1,
    _MARKER_V20,
    _MARKER_V22,
    _MARKER_V22_44,
    _PAGES,
    _U32,
    _U64,
    MARKER_V2_VALUE_BYTES,
    MARKER_V22_SHORT,
    _encode,
    _ok_response,
)


class DcpSnapshotMarker(NamedTuple):
    """DCP_SNAPSHOT_MARKER 0x56 (snapshot-marker.md, whose example bytes disagree with its tables).

    V1: 20-byte extras. V2.0: 1-byte extras (version 0x00) + 36-byte value with max visible seqno
    and high completed seqno. V2.2: version 0x02 + a value adding the purge seqno and the high
    prepared seqno (52 bytes), or the purge seqno alone (44 bytes: the layout clients built from
    the page's first text meet; `high_prepared_seqno` None, and encoded so). Version 0x01 is
    invalid.
    """

    vbucket: int
    start_seqno: int
    end_seqno: int
    flags: int = SnapshotFlag.MEMORY
    version: int = MarkerVersion.V1
    max_visible_seqno: int = 0
    high_completed_seqno: int = 0
    purge_seqno: int = 0
    high_prepared_seqno: int | None = 0
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_SNAPSHOT_MARKER

    def encode(self) -> bytes:
        if self.version == MarkerVersion.V1:
            extras, value = _MARKER_V1.pack(self.start_seqno, self.end_seqno, self.flags), b""
        elif self.version == MarkerVersion.V2_0:
            extras = b"\x00"
            value = _MARKER_V20.pack(self.start_seqno, self.end_seqno, self.flags, self.max_visible_seqno,
                                     self.high_completed_seqno)
        elif self.version == MarkerVersion.V2_2:
            extras = b"\x02"
            if self.high_prepared_seqno is None:
                value = _MARKER_V22_44.pack(self.start_seqno, self.end_seqno, self.flags, self.max_visible_seqno,
                                            self.high_completed_seqno, self.purge_seqno)
            else:
                value = _MARKER_V22.pack(self.start_seqno, self.end_seqno, self.flags, self.max_visible_seqno,
                                         self.high_completed_seqno, self.purge_seqno, self.high_prepared_seqno)
        else:
            raise ValueError(f"snapshot marker version {self.version} is not V1, V2.0 or V2.2")
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, value=value,
                       stream_id=self.stream_id)

    def response(self, status: int = Status.SUCCESS) -> bytes:
        """The consumer's reply, owed only when the Ack flag is set."""
        return _ok_response(self.opcode, self.opaque, status)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSnapshotMarker":
        rules.check(frame)
        sid = frame.stream_id
        if len(frame.extras) == 20:
            start, end, flags = _MARKER_V1.unpack(frame.extras)
            return cls(frame.vbucket, start, end, flags, MarkerVersion.V1, opaque=frame.opaque, stream_id=sid)
        if frame.extras[0] == MarkerVersion.V2_0:
            start, end, flags, mvs, hcs = _MARKER_V20.unpack(frame.value)
            return cls(frame.vbucket, start, end, flags, MarkerVersion.V2_0, mvs, hcs, opaque=frame.opaque,
                       stream_id=sid)
        if len(frame.value) == MARKER_V22_SHORT:
            start, end, flags, mvs, hcs, purge = _MARKER_V22_44.unpack(frame.value)
            hps = None
        else:
            start, end, flags, mvs, hcs, purge, hps = _MARKER_V22.unpack(frame.value)
        return cls(frame.vbucket, start, end, flags, MarkerVersion.V2_2, mvs, hcs, purge, hps, frame.opaque,
                   sid)


rules.register(Opcode.DCP_SNAPSHOT_MARKER,
               Shape(_PAGES + "snapshot-marker.md", extras=(20, 1), value=MAY),
               Shape(_PAGES + "snapshot-marker.md"))


@rules.request_check(Opcode.DCP_SNAPSHOT_MARKER)
def _marker_rules(frame: Frame):
    page = "snapshot-marker.md"
    n = len(frame.extras)
    if n == 20:
        if frame.value:
            yield ProtocolError(f"a V1 snapshot marker (20-byte extras) must not have a value ({page})")
        start, end, flags = _MARKER_V1.unpack(frame.extras)
    elif n == 1:
        version = frame.extras[0]
        want = MARKER_V2_VALUE_BYTES.get(version)
        if want is None:
            yield ProtocolError(f"snapshot marker version 0x{version:02x} is invalid; V2.0 is 0x00 and V2.2 is "
                                f"0x02")
            return
        v22 = version == MarkerVersion.V2_2
        if len(frame.value) != want and not (v22 and len(frame.value) == MARKER_V22_SHORT):
            short = f" (or {MARKER_V22_SHORT}, without the high prepared seqno)" if v22 else ""
            yield ProtocolError(f"a V2.{version} snapshot marker value must be {want} bytes{short}; got "
                                f"{len(frame.value)} ({page})")
            return
        start, end, flags = _MARKER_V1.unpack_from(frame.value)
    else:
        return
    if start > end:
        yield ProtocolError(f"snapshot start {start} is greater than snapshot end {end} ({page})")
    if flags & ~sum(SnapshotFlag):
        yield ProtocolError(f"snapshot marker has unknown flag bits 0x{flags & ~sum(SnapshotFlag):x} ({page})")
    if flags & (SnapshotFlag.MEMORY | SnapshotFlag.DISK) == SnapshotFlag.MEMORY | SnapshotFlag.DISK:
        yield ProtocolError(f"snapshot marker cannot be both Memory and Disk ({page})")


class DcpSeqnoAdvanced(NamedTuple):
    """DCP_SEQNO_ADVANCED 0x64 (seqno-advanced.md; its example bytes are wrong): 8-byte seqno."""

    vbucket: int
    by_seqno: int
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_SEQNO_ADVANCED

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U64.pack(self.by_seqno),
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSeqnoAdvanced":
        rules.check(frame)
        return cls(frame.vbucket, _U64.unpack(frame.extras)[0], frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_SEQNO_ADVANCED, Shape(_PAGES + "seqno-advanced.md", extras=(8,)))


class DcpOsoSnapshot(NamedTuple):
    """DCP_OSO_SNAPSHOT 0x65 (oso_snapshot.md): u32 flags, 0x01 start / 0x02 end."""

    vbucket: int
    flags: int
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_OSO_SNAPSHOT

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U32.pack(self.flags),
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpOsoSnapshot":
        rules.check(frame)
        return cls(frame.vbucket, _U32.unpack(frame.extras)[0], frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_OSO_SNAPSHOT, Shape(_PAGES + "oso_snapshot.md", extras=(4,)))


@rules.request_check(Opcode.DCP_OSO_SNAPSHOT)
def _oso_rules(frame: Frame):
    if len(frame.extras) == 4:
        flags = _U32.unpack(frame.extras)[0]
        if flags not in (OsoFlag.START, OsoFlag.END):
            yield ProtocolError(f"DCP_OSO_SNAPSHOT flags must be 0x01 (start) or 0x02 (end); got 0x{flags:x} "
                                f"(oso_snapshot.md)")
