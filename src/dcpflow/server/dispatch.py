"""What a command is: a handler, and what it needs checked before it runs.

The table of every command is commands.py. A handler is `handler(conn, frame)` and returns the
reply bytes, None for no reply (quiet commands), or an awaitable of either; the connection stops
reading further requests until an awaitable is done, so replies stay in request order. Handlers
raise EngineError / ProtocolError for error replies.
"""

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple

from dcpflow.protocol.frame import Frame

if TYPE_CHECKING:
    from .connection import Connection

Reply = bytes | None
Handler = Callable[["Connection", Frame], Reply | Awaitable[Reply]]


class Command(NamedTuple):
    handler: Handler
    auth: bool = True  # needs an authenticated user
    bucket: bool = True  # needs a selected bucket
    privilege: int = 0  # all of these Privilege bits, in the selected bucket (a plain int: cheap to test)
    key: bool = False  # the key is a document key: its rules are checked before the session's (EINVAL first)
