"""One dispatch table for every typed message of the protocol package (DCP, KV, *WithMeta)."""

from . import dcp
from .errors import ProtocolError
from .frame import Frame
from .status import Status

REQUEST_TYPES: dict[int, type] = {}
RESPONSE_TYPES: dict[int, type] = {}

for _module in (dcp,):
    REQUEST_TYPES.update(_module.REQUEST_TYPES)
    RESPONSE_TYPES.update(_module.RESPONSE_TYPES)


def decode_message(frame: Frame):
    """The typed message of any frame this package knows; ProtocolError if it breaks a rule or is
    unknown (UNKNOWN_COMMAND)."""
    if frame.is_response:
        return RESPONSE_TYPES.get(frame.opcode, dcp.Response).from_frame(frame)
    cls = REQUEST_TYPES.get(frame.opcode)
    if cls is None:
        raise ProtocolError(f"no typed decoder for opcode 0x{frame.opcode:02x}", Status.UNKNOWN_COMMAND,
                            opcode=frame.opcode, opaque=frame.opaque)
    return cls.from_frame(frame)
