"""dcpflow.server: an asyncio server speaking Couchbase's binary protocol over the dcpflow engine.

`Server(ServerConfig(data_dir=...))` serves KV commands and DCP to official SDKs and dcpflow's
own clients; `dcpflow server` runs one in the foreground. Modules: app (listener, lifecycle,
flusher/expiry/compaction tasks), connection (framing, ordered replies, dispatch), replies (its
error replies), durable (durable writes: a handler's SyncWrite write mode), commands (the
command table: opcode -> handler and its checks), dispatch (what a command is), session (HELLO,
SASL, buckets, cluster map, error map), kv (KV commands), stats (STAT groups), auth (users, roles,
SCRAM/PLAIN), topology (cluster map); mgmt (the HTTP management plane beside the KV port: REST,
/metrics, the /ui/ page, fault injection) and faults (what it injects); for DCP, dcp_commands
(the DCP commands), producer and consumer (the asyncio shells of dcpflow.dcp's state machines:
they execute the outcomes those return), conn_handler (the DCP role of a connection, typed) and
backfill (the backfill threads). The engine and dcpflow.dcp never import this package, and
the protocol imports nothing of ours.
"""

from .app import Server, ServerBucket, ServerConfig
from .auth import Privilege, User, UserDB, make_user

__all__ = ["Privilege", "Server", "ServerBucket", "ServerConfig", "User", "UserDB", "make_user"]
