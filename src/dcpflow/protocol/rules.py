"""Structural rules of each command, as its reference page states them, in one registry.

Every page opens with a list like "Must have extras / Must not have key / May have value". A `Shape`
restates that list; `problems(frame)` returns every rule a frame breaks as a ProtocolError that
carries the status a server must answer (EINVAL unless the page says otherwise) and a reason.
Decoders call `check(frame)`, `dcpflow inspect` lists `problems(frame)`: one place for the rules.
"""

from collections.abc import Callable, Iterable
from typing import NamedTuple

from .errors import ProtocolError
from .frame import Frame, Magic, check_request_frame_infos
from .opcodes import OPCODE_DESCRIPTIONS, Opcode
from .status import Status

MUST, MUST_NOT, MAY = "must", "must not", "may"


class Shape(NamedTuple):
    """What a page says a packet must carry. `extras` lists the allowed lengths (None = any)."""

    page: str
    extras: tuple[int, ...] | None = (0,)
    key: str = MUST_NOT
    value: str = MUST_NOT
    cas: str = MAY  # MUST: non-zero, MUST_NOT: zero


Check = Callable[[Frame], Iterable[ProtocolError]]

_request_shapes: dict[int, Shape] = {}
_response_shapes: dict[int, Shape] = {}
_request_checks: dict[int, list[Check]] = {}
_response_checks: dict[int, list[Check]] = {}


def register(opcode: int, request: Shape | None = None, response: Shape | None = None) -> None:
    if request is not None:
        _request_shapes[opcode] = request
    if response is not None:
        _response_shapes[opcode] = response


def request_check(*opcodes: int):
    """Decorator: an extra rule for requests of these opcodes (beyond their Shape)."""
    def deco(fn: Check) -> Check:
        for op in opcodes:
            _request_checks.setdefault(op, []).append(fn)
        return fn
    return deco


def response_check(*opcodes: int):
    def deco(fn: Check) -> Check:
        for op in opcodes:
            _response_checks.setdefault(op, []).append(fn)
        return fn
    return deco


def opcode_name(opcode: int) -> str:
    try:
        return Opcode(opcode).name
    except ValueError:
        return f"0x{opcode:02x}"


def _shape_problems(frame: Frame, shape: Shape) -> Iterable[ProtocolError]:
    n = len(frame.extras)
    if (shape.extras is None or n in shape.extras) and _parts_ok(frame, shape):
        return  # the common case: no name lookup, no strings (every typed decode passes through here)
    name = opcode_name(frame.opcode)
    if shape.extras is not None and n not in shape.extras:
        want = " or ".join(str(x) for x in shape.extras)
        if shape.extras == (0,):
            yield ProtocolError(f"{name} must not have extras; got {n} bytes ({shape.page})")
        else:
            yield ProtocolError(f"{name} extras must be {want} bytes; got {n} ({shape.page})")
    for part, rule in (("key", shape.key), ("value", shape.value)):
        size = len(getattr(frame, part))
        if rule == MUST and not size:
            yield ProtocolError(f"{name} must have a {part} ({shape.page})")
        elif rule == MUST_NOT and size:
            yield ProtocolError(f"{name} must not have a {part}; got {size} bytes ({shape.page})")
    if shape.cas == MUST and not frame.cas:
        yield ProtocolError(f"{name} must carry a non-zero CAS ({shape.page})")
    elif shape.cas == MUST_NOT and frame.cas:
        yield ProtocolError(f"{name} must carry CAS 0; got 0x{frame.cas:x} ({shape.page})")


def _parts_ok(frame: Frame, shape: Shape) -> bool:
    for part, rule in ((frame.key, shape.key), (frame.value, shape.value)):
        if (rule == MUST and not part) or (rule == MUST_NOT and part):
            return False
    return not ((shape.cas == MUST and not frame.cas) or (shape.cas == MUST_NOT and frame.cas))


def problems(frame: Frame) -> list[ProtocolError]:
    """Every structural rule this frame breaks (empty list: none)."""
    out: list[ProtocolError] = []
    is_response = frame.is_response
    if frame.magic in (Magic.SERVER_REQUEST, Magic.SERVER_RESPONSE):
        return out  # duplex commands have their own opcode space; not validated here
    if not is_response:
        if frame.framing:
            out.extend(check_request_frame_infos(frame.framing))
        if frame.opcode not in OPCODE_DESCRIPTIONS:
            out.append(ProtocolError(f"unknown opcode 0x{frame.opcode:02x}", Status.UNKNOWN_COMMAND))
            return out
    shape = (_response_shapes if is_response else _request_shapes).get(frame.opcode)
    # Error responses carry whatever the error needs (a rollback seqno, a cluster map, text): no shape.
    if shape is not None and not (is_response and frame.status != Status.SUCCESS):
        out.extend(_shape_problems(frame, shape))
    for check in (_response_checks if is_response else _request_checks).get(frame.opcode, ()):
        out.extend(check(frame))
    return out


def check(frame: Frame) -> None:
    """Raise the first problem of this frame, with the frame's opcode and opaque attached."""
    found = problems(frame)
    if found:
        err = found[0]
        err.opcode, err.opaque, err.magic = frame.opcode, frame.opaque, frame.magic
        raise err


def shape_of(opcode: int, response: bool = False) -> Shape | None:
    return (_response_shapes if response else _request_shapes).get(opcode)
