"""The dispatch table: request opcode -> handler, with what the handler needs checked before it runs.

Each handler module registers its commands with `@command(...)`; the connection looks the opcode
up, checks authentication, bucket and privilege in that order (unauthenticated: EACCESS; no bucket
selected: NO_BUCKET; missing privilege: EACCESS - docs/rbac.md), then calls
`handler(conn, frame)`. A handler returns the reply bytes, None for no reply (quiet commands), or
an awaitable of either; the connection stops reading further requests until an awaitable is done,
so replies stay in request order. Handlers raise EngineError / ProtocolError for error replies.

The DCP work adds its opcodes here the same way (DCP_OPEN turns the connection into a producer or
consumer; its messages go out through the same Writer).
"""

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple

from dcpflow.protocol.frame import Frame

from .auth import Privilege

if TYPE_CHECKING:
    from .connection import Connection

Reply = bytes | None
Handler = Callable[["Connection", Frame], Reply | Awaitable[Reply]]


class Command(NamedTuple):
    handler: Handler
    auth: bool = True  # needs an authenticated user
    bucket: bool = True  # needs a selected bucket
    privilege: int = 0  # all of these Privilege bits, in the selected bucket (a plain int: cheap to test)


COMMANDS: dict[int, Command] = {}


def command(*opcodes: int, auth: bool = True, bucket: bool = True, privilege: Privilege = Privilege.NONE):
    """Register the decorated function as the handler of `opcodes`."""
    def deco(fn: Handler) -> Handler:
        for op in opcodes:
            if op in COMMANDS:
                raise RuntimeError(f"opcode 0x{op:02x} registered twice")
            COMMANDS[op] = Command(fn, auth, bucket, int(privilege))
        return fn
    return deco
