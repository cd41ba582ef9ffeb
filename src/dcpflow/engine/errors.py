"""The one exception the engine raises for a refused operation.

Errors are values with meaning: every refusal carries the status code the server must answer
with (KEY_ENOENT, KEY_EEXISTS, EINVAL, NOT_MY_VBUCKET, ETMPFAIL, ERANGE...) and a reason a person
can act on, so the server maps it to a response without a lookup table of its own.
"""

from dcpflow.protocol.status import Status


class EngineError(Exception):
    """An engine operation was refused; `status` is the response status to send."""

    def __init__(self, status: Status, reason: str = ""):
        super().__init__(reason or status.name)
        self.status = status
        self.reason = reason or status.name

    def __str__(self) -> str:
        return f"{self.reason} (status {self.status.name})"
