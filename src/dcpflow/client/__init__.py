"""dcpflow.client: an asyncio DCP client for dcpflow server and Couchbase Server 7.x.

    from dcpflow.client import DcpClient, Offset, RollbackError

    async with await DcpClient.connect("couchbase://127.0.0.1/default", "Administrator", "password") as c:
        async for event in c.events(start="beginning", end="now"):
            ...

See docs/client.md. Arrow batches (`DcpClient.batches`) need pyarrow and numpy (the `arrow` extra).
"""

import importlib

#: Public name -> the module that defines it. Loaded on first use (PEP 562): a Spark worker that
#: only needs `dcpflow.client.offsets` does not pay for asyncio, the connection and the streams.
_EXPORTS = {
    "DcpClient": "client",
    "ConnSpec": "connstr", "parse_connection_string": "connstr",
    **dict.fromkeys(("AuthenticationError", "BucketError", "ClientError", "ConnectError", "ConnectionLostError",
                     "ConnectionStringError", "DeadConnectionError", "RollbackError", "ServerError",
                     "StateStoreError", "StreamError"), "errors"),
    **dict.fromkeys(("Deletion", "Expiration", "Mutation", "Rollback", "SnapshotMarker", "StreamEnd", "SystemEvent"),
                    "events"),
    "BEGINNING": "offsets", "Offset": "offsets",
    **dict.fromkeys(("Filter", "FilterError", "Manifest"), "manifest"),
    **dict.fromkeys(("ClientState", "JsonFileStore", "MemoryStore", "StateStore"), "state"),
    "SCHEMA": "batches",  # pyarrow is optional
}

__all__ = [
    "BEGINNING", "AuthenticationError", "BucketError", "ClientError", "ClientState", "ConnSpec", "ConnectError",
    "ConnectionLostError", "ConnectionStringError", "DcpClient", "DeadConnectionError", "Deletion", "Expiration",
    "Filter", "FilterError", "Manifest",
    "JsonFileStore", "MemoryStore", "Mutation", "Offset", "Rollback", "RollbackError", "ServerError", "SnapshotMarker",
    "StateStore", "StateStoreError", "StreamEnd", "StreamError", "SystemEvent", "parse_connection_string",
]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dcpflow.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
