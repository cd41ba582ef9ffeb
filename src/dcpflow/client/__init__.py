"""dcpflow.client: an asyncio DCP client for dcpflow server and Couchbase Server 7.x.

    from dcpflow.client import DcpClient, Offset, RollbackError

    async with await DcpClient.connect("couchbase://127.0.0.1/default", "Administrator", "password") as c:
        async for event in c.events(start="beginning", end="now"):
            ...

See docs/client.md. Arrow batches (`DcpClient.batches`) need pyarrow and numpy (the `arrow` extra).
"""

from .client import DcpClient
from .connstr import ConnSpec, parse_connection_string
from .errors import (
    AuthenticationError,
    BucketError,
    ClientError,
    ConnectError,
    ConnectionLostError,
    ConnectionStringError,
    DeadConnectionError,
    RollbackError,
    ServerError,
    StateStoreError,
    StreamError,
)
from .events import Deletion, Expiration, Mutation, Rollback, SnapshotMarker, StreamEnd, SystemEvent
from .offsets import BEGINNING, Offset
from .state import ClientState, JsonFileStore, MemoryStore, StateStore

__all__ = [
    "BEGINNING", "AuthenticationError", "BucketError", "ClientError", "ClientState", "ConnSpec", "ConnectError",
    "ConnectionLostError", "ConnectionStringError", "DcpClient", "DeadConnectionError", "Deletion", "Expiration",
    "JsonFileStore", "MemoryStore", "Mutation", "Offset", "Rollback", "RollbackError", "ServerError", "SnapshotMarker",
    "StateStore", "StateStoreError", "StreamEnd", "StreamError", "SystemEvent", "parse_connection_string",
]


def __getattr__(name):
    if name == "SCHEMA":  # lazily: pyarrow is optional
        from .batches import SCHEMA
        return SCHEMA
    raise AttributeError(f"module 'dcpflow.client' has no attribute {name!r}")
