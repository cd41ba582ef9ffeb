"""Structural rules of each command, as its reference page states them, in one registry.

Every page opens with a list like "Must have extras / Must not have key / May have value". A `Shape`
restates that list; `problems(frame)` returns every rule a frame breaks as a ProtocolError that
carries the status a server must answer (EINVAL unless the page says otherwise) and a reason.
Decoders call `check(frame)`; `dcpflow inspect` lists `problems(frame)` and decodes inside `lenient()`,
so it shows a body beside the rules it breaks: one place for the rules.
"""

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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


_OPCODE_NAMES = {int(op): op.name for op in Opcode}


def opcode_name(opcode: int) -> str:
    """A dict lookup, not Opcode(op).name: every typed decode passes through the rules."""
    return _OPCODE_NAMES.get(opcode) or f"0x{opcode:02x}"


def _shape_problems(frame: Frame, shape: Shape) -> list[ProtocolError]:
    """A plain function over a list, not a generator: every typed decode passes through here."""
    out: list[ProtocolError] = []
    n = len(frame.extras)
    if shape.extras is not None and n not in shape.extras:
        name = opcode_name(frame.opcode)
        if shape.extras == (0,):
            out.append(ProtocolError(f"{name} must not have extras; got {n} bytes ({shape.page})"))
        else:
            want = " or ".join(str(x) for x in shape.extras)
            out.append(ProtocolError(f"{name} extras must be {want} bytes; got {n} ({shape.page})"))
    for part, data, rule in (("key", frame.key, shape.key), ("value", frame.value, shape.value)):
        if rule == MUST and not data:
            out.append(ProtocolError(f"{opcode_name(frame.opcode)} must have a {part} ({shape.page})"))
        elif rule == MUST_NOT and data:
            out.append(ProtocolError(f"{opcode_name(frame.opcode)} must not have a {part}; got {len(data)} bytes "
                                     f"({shape.page})"))
    if shape.cas == MUST and not frame.cas:
        out.append(ProtocolError(f"{opcode_name(frame.opcode)} must carry a non-zero CAS ({shape.page})"))
    elif shape.cas == MUST_NOT and frame.cas:
        out.append(ProtocolError(f"{opcode_name(frame.opcode)} must carry CAS 0; got 0x{frame.cas:x} "
                                 f"({shape.page})"))
    return out


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


#: False inside `lenient()`: decoders then read a body whatever rules it breaks.
_strict: ContextVar[bool] = ContextVar("dcpflow_rules_strict", default=True)


@contextmanager
def lenient() -> Iterator[None]:
    """Within this block `check` raises nothing, so a decoder reads a body that breaks a rule
    (a failover log that is not newest-first, a value where none belongs) instead of refusing it:
    for a dissector (`dcpflow inspect`), which lists `problems(frame)` itself and still shows what
    the body says. A body whose layout cannot be read at all still raises from the decoder."""
    token = _strict.set(False)
    try:
        yield
    finally:
        _strict.reset(token)


def check(frame: Frame) -> None:
    """Raise the first problem of this frame, with the frame's opcode and opaque attached (nothing
    inside `lenient()`)."""
    found = problems(frame)
    if found and _strict.get():
        err = found[0]
        err.opcode, err.opaque, err.magic = frame.opcode, frame.opaque, frame.magic
        raise err


def shape_of(opcode: int, response: bool = False) -> Shape | None:
    return (_response_shapes if response else _request_shapes).get(opcode)
