"""Exceptions of the DCP client. Each names what went wrong and, where there is one, what to do.

All derive from `ClientError`, so `except ClientError` catches everything the client raises on
purpose; anything else is a bug.
"""

from dcpflow.protocol.status import status_name

__all__ = ["status_name"]  # re-exported: the client's modules take it from here


class ClientError(Exception):
    """Base class of every error the client raises on purpose."""


class ConnectionStringError(ClientError, ValueError):
    """The connection string cannot be used (bad scheme, host, port, bucket or option)."""


class ConnectError(ClientError, ConnectionError):
    """No node of the connection string could be reached or bootstrapped."""


class AuthenticationError(ClientError):
    """SASL failed: wrong username or password, or a mechanism the server refuses."""


class BucketError(ClientError):
    """The bucket does not exist or the user may not use it."""


class ServerError(ClientError):
    """A request failed with a status the client cannot recover from."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class StreamError(ServerError):
    """A vbucket's stream could not be opened or kept open (the status and vbucket say why)."""

    def __init__(self, message: str, vbucket: int, status: int | None = None):
        super().__init__(message, status)
        self.vbucket = vbucket


class RollbackError(ClientError):
    """The server told us to roll a vbucket back (rollback policy "raise").

    `seqno` is the newest consistent point at or below the server's rollback seqno. Everything the
    application took from this vbucket after it belongs to a history the server no longer has, or
    to a snapshot that cannot be resumed in the middle: discard it, then read again from `offset`
    (that point with the failover entry that covers it)."""

    def __init__(self, vbucket: int, seqno: int, offset=None):
        super().__init__(f"vbucket {vbucket} must roll back to seqno {seqno}: the server's history diverged from "
                         f"ours after that point; discard what was read beyond it and resume from there")
        self.vbucket = vbucket
        self.seqno = seqno
        self.offset = offset


class ConnectionLostError(ClientError, ConnectionError):
    """A connection died and could not be re-established within the reconnect budget."""


class DeadConnectionError(ConnectionLostError):
    """Nothing arrived for longer than the dead-connection timeout (noops stopped)."""


class StateStoreError(ClientError):
    """The offsets file is unreadable or does not belong to this bucket."""
