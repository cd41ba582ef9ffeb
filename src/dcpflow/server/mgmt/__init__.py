"""The management plane: HTTP beside the KV port, on the port the cluster map advertises as `mgmt`.

Modules: app (the listener, authentication and permissions, errors, request bodies), nodes
(`/pools`, `/pools/default`, nodeServices, the terse bucket map, `/`), buckets (list, get,
create, update, drop, flush), collections (scopes and collections), streaming (the
streaming config endpoints `bs` and `bucketsStreaming`), users (user management and roles), metrics (`/metrics`,
Prometheus), ui (the `/ui/` page; `static/` holds its stylesheet and script), observe (samples
for the charts, the event log, rollback and failover counters), dcpview (the one reader of
the DCP connections' stats) and faults (fault injection, `/faults/...`; server/faults does the
work). `ROUTERS` lists the modules whose `routes` the listener serves; the server hands it to
the listener it makes (server/app.py), so the routers import `app` and nothing imports them back.
"""

from . import buckets, collections, faults, metrics, nodes, streaming, ui, users
from .app import ManagementListener

ROUTERS = (nodes, buckets, collections, streaming, users, metrics, ui, faults)

__all__ = ["ROUTERS", "ManagementListener"]
