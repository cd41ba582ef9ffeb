"""dcpflow.server: an asyncio server speaking Couchbase's binary protocol over the dcpflow engine.

`Server(ServerConfig(data_dir=...))` serves KV commands (and, later, DCP) to official SDKs and
dcpflow's own clients; `dcpflow server` runs one in the foreground. Modules: app (listener,
lifecycle, flusher/expiry/compaction tasks), connection (framing, ordered replies, dispatch),
dispatch (opcode -> handler table), session (HELLO, SASL, buckets, cluster map, error map), kv
(KV commands), stats (STAT groups), auth (users, roles, SCRAM/PLAIN), topology (cluster map), and
mgmt (the HTTP management plane beside the KV port: REST, /metrics, the /ui/ page).
The engine never imports this package, and the protocol imports nothing of ours.
"""

from .app import Server, ServerBucket, ServerConfig
from .auth import Privilege, User, UserDB, make_user

__all__ = ["Privilege", "Server", "ServerBucket", "ServerConfig", "User", "UserDB", "make_user"]
