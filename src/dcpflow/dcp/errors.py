"""Refusal: a request the DCP rules turn down, as a value (the status to answer and why).

The state machines return these instead of raising, so a caller cannot mistake a refusal for a bug;
the server's shells turn them into error replies (with the reason as XERROR context), exactly as
the protocol's ProtocolError/EngineError carry a status and a reason a person can act on.
"""

from typing import NamedTuple


class Refusal(NamedTuple):
    status: int
    reason: str = ""
