"""STAT 0x10 (BinaryProtocol.md#0x10-stat): the request, its stream of key/value replies and the
collector that reads them back.
"""

from typing import NamedTuple

from .. import rules
from ..datatype import Datatype
from ..errors import ProtocolError
from ..frame import Frame, request, response
from ..opcodes import Opcode
from ..rules import MAY, Shape
from ..status import Status
from .common import _BP, _check_opcode, _json_value_problems

# ---------------------------------------------------------------------------------------------
# Statistics


class Stat(NamedTuple):
    """STAT 0x10 (BinaryProtocol.md#0x10-stat): key = group (`dcp`, `vbucket-seqno`, `failovers`, ...;
    empty = default set); optional JSON value with arguments (datatype JSON)."""

    group: bytes = b""
    value: bytes = b""
    opaque: int = 0

    opcode = Opcode.STAT

    def encode(self) -> bytes:
        return request(self.opcode, key=self.group, value=self.value, opaque=self.opaque,
                       datatype=Datatype.JSON if self.value else 0)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Stat":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.key, frame.value, frame.opaque)


class StatResponse(NamedTuple):
    """One statistic: name in the key, ASCII value in the value. A frame with neither ends the
    sequence (`is_terminator`)."""

    key: bytes = b""
    value: bytes = b""
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.STAT

    def encode(self) -> bytes:
        if self.status != Status.SUCCESS:
            return response(self.opcode, self.status, opaque=self.opaque)
        return response(self.opcode, key=self.key, value=self.value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "StatResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls(b"", b"", frame.opaque, frame.status)
        return cls(frame.key, frame.value, frame.opaque, frame.status)

    @property
    def is_terminator(self) -> bool:
        return self.status != Status.SUCCESS or not self.key


def _b(x) -> bytes:
    return x if isinstance(x, bytes | bytearray | memoryview) else str(x).encode()


def encode_stats(stats, opaque: int = 0) -> bytes:
    """The whole reply to one STAT request: a frame per (name, value) pair, then the empty terminator.

    `stats` is a mapping or an iterable of pairs; names and values may be str, bytes or numbers."""
    pairs = stats.items() if hasattr(stats, "items") else stats
    frames = [response(Opcode.STAT, key=_b(k), value=_b(v), opaque=opaque) for k, v in pairs]
    frames.append(response(Opcode.STAT, opaque=opaque))
    return b"".join(frames)


class StatsCollector:
    """Client side of STAT: feed it the STAT response frames of one request until `feed` returns True.

    `stats` keeps the order the server sent; an error status ends the sequence at once (an unknown
    group answers KEY_ENOENT, for example) and is kept in `status`.
    """

    __slots__ = ("opaque", "stats", "status", "done")

    def __init__(self, opaque: int | None = None):
        self.opaque = opaque
        self.stats: dict[str, str] = {}
        self.status = Status.SUCCESS
        self.done = False

    def feed(self, frame: Frame) -> bool:
        if self.done:
            raise ProtocolError("STAT reply already ended with its empty terminator frame",
                                opcode=frame.opcode, opaque=frame.opaque)
        if self.opaque is not None and frame.opaque != self.opaque:
            raise ProtocolError(f"STAT reply opaque 0x{frame.opaque:08x} does not match the request's "
                                f"0x{self.opaque:08x}", opcode=frame.opcode, opaque=frame.opaque)
        stat = StatResponse.from_frame(frame)
        if stat.is_terminator:
            self.status = Status(stat.status) if stat.status in Status._value2member_map_ else stat.status
            self.done = True
        else:
            self.stats[stat.key.decode("utf-8", "replace")] = stat.value.decode("utf-8", "replace")
        return self.done


rules.register(Opcode.STAT, Shape(_BP + "#0x10-stat", key=MAY, value=MAY),
               Shape(_BP + "#0x10-stat", key=MAY, value=MAY))


@rules.request_check(Opcode.STAT)
def _stat_rules(frame: Frame):
    yield from _json_value_problems(frame, "STAT", _BP + "#0x10-stat")
