"""Errors of the protocol layer.

A `ProtocolError` always carries the status a server must answer with (EINVAL unless a page says
otherwise) and a reason a person can act on, so the server can reply and the CLI can explain.
"""

from .status import Status


class ProtocolError(Exception):
    """A frame or message breaks a rule of the protocol.

    `fatal` means the byte stream can no longer be trusted (bad magic, oversize body): the
    connection must be closed. A non-fatal error concerns one frame whose boundaries were sound;
    the decoder has consumed it and the caller may answer `status` and carry on.
    """

    def __init__(self, reason: str, status: int = Status.EINVAL, *, fatal: bool = False,
                 opcode: int | None = None, opaque: int | None = None, magic: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status = Status(status) if status in Status._value2member_map_ else status
        self.fatal = fatal
        self.opcode = opcode
        self.opaque = opaque
        self.magic = magic

    def __str__(self) -> str:
        name = self.status.name if isinstance(self.status, Status) else f"0x{self.status:04x}"
        return f"{self.reason} (status {name})"
