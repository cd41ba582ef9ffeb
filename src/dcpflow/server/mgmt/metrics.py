"""`GET /metrics`: Prometheus text exposition format 0.0.4
(https://prometheus.io/docs/instrumenting/exposition_formats/), with names close to Couchbase's
own (https://docs.couchbase.com/server/current/metrics-reference/data-service-metrics.html):

node        kv_uptime_seconds, kv_curr_connections, kv_total_connections, kv_max_connections{type} (client,
            system, http), kv_connections_refused_total{reason} (limit, reserve, descriptors,
            unauthenticated_evicted, auth_timeout, http_limit, http_evicted, http_timeout),
            process_resident_memory_bytes, kv_login_lockouts_total (throttle.py),
            kv_audit_events_total{event} (audit.py), kv_audit_dropped_events_total (events the audit file
            lost), kv_log_lines_suppressed_total{event} (per-request lines over the log's rate limit,
            boundedlog.py)
bucket      kv_ops{op,result}, kv_curr_items, kv_curr_items_tot, kv_num_vbuckets{state},
            kv_ep_queue_size (the flusher's queue), kv_ep_total_persisted, kv_checkpoint_memory_bytes,
            memory (engine/memory.py): kv_mem_used_bytes, kv_ep_max_size_bytes, kv_ep_mem_high_wat_bytes,
            kv_ep_mem_low_wat_bytes, kv_ep_value_size_bytes, kv_ep_meta_data_memory_bytes,
            kv_ep_checkpoint_memory_quota_bytes, kv_ep_num_value_ejects_total, kv_ep_bg_fetched_total,
            kv_ep_tmp_oom_errors_total, kv_ep_oom_errors_total, kv_ep_cursors_dropped_total,
            store: kv_ep_compactions_total{reason}, kv_couch_docs_fragmentation (percent),
            kv_ep_db_file_size_bytes, kv_ep_db_history_rows,
            kv_vb_high_seqno{vb,state}, kv_vb_persisted_seqno{vb},
            kv_vb_rollbacks_total, kv_vb_failovers_total (since the server started)
DCP         kv_dcp_connections{type}; per connection kv_dcp_items_remaining, kv_dcp_items_sent,
            kv_dcp_total_data_size_bytes, kv_dcp_flow_control_unacked_bytes,
            kv_dcp_flow_control_buffer_bytes; per stream kv_dcp_stream_items_remaining,
            kv_dcp_stream_ready_queue_bytes, kv_dcp_stream_last_seqno
replication kv_dcp_replication_lag_items{link}: items this node's actives are ahead of the replica
            at the other end of each `replication:` link

Every bucket-level series carries `bucket`; DCP series also `connection` (the DCP connection
name) and stream series `vb` (and `sid` with stream ids). Who may scrape: admin, or a user with
the stats privilege on a bucket (data_reader, bucket_full_access...), who sees the series of the
buckets they may read stats of and the node's.
"""

import os
import resource
import sys
import time

from aiohttp import web

from ..audit import EVENTS as AUDIT_EVENTS
from ..stats import fragmentation_stats
from . import dcpview
from .app import SERVER, allowed, require

routes = web.RouteTableDef()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class Exposition:
    """Metric families in the order first added; each family's samples in the order added."""

    def __init__(self):
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, kind: str, help_text: str, value, **labels) -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = (kind, help_text, [])
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items() if v is not None)
        family[2].append(f"{name}{{{label_text}}} {_number(value)}" if label_text else f"{name} {_number(value)}")

    def render(self) -> str:
        out = []
        for name, (kind, help_text, samples) in self._families.items():
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(samples)
        return "\n".join(out) + "\n"


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the peak, where statm is missing
        return peak if sys.platform == "darwin" else peak * 1024


#: Memory series of a bucket: (metric, engine stat, kind, help).
_MEMORY = (
    ("kv_mem_used_bytes", "mem_used", "gauge", "Memory the bucket counts against its quota (documents and "
     "checkpoints)."),
    ("kv_ep_max_size_bytes", "ep_max_size", "gauge", "The bucket's memory quota (0: unlimited)."),
    ("kv_ep_mem_high_wat_bytes", "ep_mem_high_wat", "gauge", "Above this the item pager evicts values."),
    ("kv_ep_mem_low_wat_bytes", "ep_mem_low_wat", "gauge", "The item pager evicts down to this."),
    ("kv_ep_value_size_bytes", "ep_value_size", "gauge", "Resident values in the hash tables."),
    ("kv_ep_meta_data_memory_bytes", "ep_meta_data_memory", "gauge", "Keys and metadata in the hash tables."),
    ("kv_ep_checkpoint_memory_quota_bytes", "ep_checkpoint_memory_quota", "gauge",
     "What checkpoints may hold before writes get ETMPFAIL."),
    ("kv_ep_num_value_ejects_total", "ep_num_value_ejects", "counter", "Values evicted by the item pager."),
    ("kv_ep_bg_fetched_total", "ep_bg_fetched", "counter", "Evicted values read back from disk."),
    ("kv_ep_bg_meta_fetched_total", "ep_bg_meta_fetched", "counter",
     "Evicted keys' metadata read back from disk (full eviction)."),
    ("kv_vb_active_perc_mem_resident_ratio", "vb_active_perc_mem_resident", "gauge",
     "Percent of the active vbuckets' documents resident in memory."),
    ("kv_ep_tmp_oom_errors_total", "ep_tmp_oom_errors", "counter", "Writes refused with ETMPFAIL for memory."),
    ("kv_ep_oom_errors_total", "ep_oom_errors", "counter", "Writes refused with ENOMEM."),
    ("kv_ep_cursors_dropped_total", "ep_cursors_dropped", "counter",
     "DCP cursors dropped to release checkpoint memory."),
)


def collect(server, may_see=lambda bucket: True) -> Exposition:
    """Every family: the node's, then those of each bucket `may_see` lets through, then DCP's."""
    m = Exposition()
    _node(m, server)
    buckets = [(name, b) for name, b in list(server.buckets.items()) if may_see(name)]
    for name, bucket in buckets:
        c = bucket.counters
        help_ops = "KV operations by type (get: hit or miss)."
        m.add("kv_ops", "counter", help_ops, c.get_hits, bucket=name, op="get", result="hit")
        m.add("kv_ops", "counter", help_ops, c.get_misses, bucket=name, op="get", result="miss")
        m.add("kv_ops", "counter", help_ops, c.cmd_set, bucket=name, op="set")
        m.add("kv_ops", "counter", help_ops, c.cmd_delete, bucket=name, op="delete")
    for name, bucket in buckets:
        _bucket(m, name, bucket, server.mgmt.observer)
    _dcp(m, dcpview.views(server, may_see))
    return m


def _node(m: Exposition, server) -> None:
    """The node's: uptime, connections and their limits, logins, memory, audit and log volume."""
    m.add("kv_uptime_seconds", "gauge", "Seconds since the server started.", round(time.time() - server.started, 3))
    m.add("kv_curr_connections", "gauge", "Open KV connections.", len(server.connections))
    m.add("kv_total_connections", "counter", "KV connections accepted since the server started.",
          server.total_connections)
    m.add("kv_max_connections", "gauge", "Client connections the server admits, and those it reserves beyond them "
          "for administrators.", server.max_connections, type="client")
    m.add("kv_max_connections", "gauge", "Client connections the server admits, and those it reserves beyond them "
          "for administrators.", server.config.system_connections, type="system")
    m.add("kv_max_connections", "gauge", "Client connections the server admits, and those it reserves beyond them "
          "for administrators.", server.mgmt_max_connections, type="http")
    for reason, n in server.refused_connections.items():
        m.add("kv_connections_refused_total", "counter", "Connections refused or closed unserved: over the limit and "
              "the reserve, one more authenticated as an ordinary user, accepts that failed for lack of descriptors, "
              "unauthenticated ones closed for a newcomer or after the timeout, and the same for management (HTTP) "
              "connections.", n, reason=reason)
    m.add("kv_login_lockouts_total", "counter", "Login attempts refused unchecked because failed logins locked "
          "their address or user out.", server.throttle.refused)
    m.add("process_resident_memory_bytes", "gauge", "Resident memory of the server process.", _resident_bytes())
    for event in AUDIT_EVENTS:
        m.add("kv_audit_events_total", "counter", "Security events recorded in the audit trail since the server "
              "started.", server.audit.counts[event.name], event=event.name)
    m.add("kv_audit_dropped_events_total", "counter", "Audit events the audit file could not take.", server.audit.lost)
    suppressed = server.log.limiter.suppressed + server.audit.limiter.suppressed
    for kind, n in sorted(suppressed.items()):
        m.add("kv_log_lines_suppressed_total", "counter", "Per-request log lines left out by the rate limit.", n,
              event=kind)


def _bucket(m: Exposition, name: str, bucket, observer) -> None:
    """A bucket's: items, vbuckets, persistence, memory, compaction, rollbacks and failovers, and
    each vbucket's seqnos."""
    engine = bucket.engine
    stats = engine.stats()
    m.add("kv_curr_items", "gauge", "Documents in active vbuckets.", stats["curr_items"], bucket=name)
    m.add("kv_curr_items_tot", "gauge", "Documents in all vbuckets (active, replica, pending).",
          stats["curr_items_tot"], bucket=name)
    for state in ("active", "replica", "pending", "dead"):
        m.add("kv_num_vbuckets", "gauge", "Vbuckets on this node by state.", stats[f"vb_{state}_num"],
              bucket=name, state=state)
    m.add("kv_ep_queue_size", "gauge", "Mutations waiting for the flusher to persist them.",
          stats["ep_queue_size"], bucket=name)
    m.add("kv_ep_total_persisted", "counter", "Items the flusher has persisted since the bucket opened.",
          stats["ep_total_persisted"], bucket=name)
    vbuckets = sorted(engine.vbuckets.items())
    m.add("kv_checkpoint_memory_bytes", "gauge", "Memory held by the vbuckets' checkpoints.",
          sum(vb.checkpoint_manager.mem_usage for _, vb in vbuckets), bucket=name)
    for metric, stat, kind, text in _MEMORY:
        m.add(metric, kind, text, stats[stat], bucket=name)
    store = fragmentation_stats(bucket)
    for reason, key in (("any", "ep_compactions"), ("fragmentation", "ep_compactions_for_fragmentation")):
        m.add("kv_ep_compactions_total", "counter", "Compactions of the bucket's store (any: every one; "
              "fragmentation: those its fragmentation started).", store[key], bucket=name, reason=reason)
    if "couch_docs_fragmentation" in store:
        m.add("kv_couch_docs_fragmentation", "gauge", "Percent of the store's rows that are older versions, as "
              "last measured.", store["couch_docs_fragmentation"], bucket=name)
        m.add("kv_ep_db_file_size_bytes", "gauge", "The store's file.", store["ep_db_file_size"], bucket=name)
        m.add("kv_ep_db_history_rows", "gauge", "Older versions kept for rollback, as last measured.",
              store["ep_db_history_rows"], bucket=name)
    m.add("kv_vb_rollbacks_total", "counter", "Vbucket rollbacks applied on this node since it started.",
          observer.rollbacks[name], bucket=name)
    m.add("kv_vb_failovers_total", "counter",
          "Vbuckets that became active here with a new failover entry since the server started.",
          observer.failovers[name], bucket=name)
    for vbid, vb in vbuckets:
        m.add("kv_vb_high_seqno", "gauge", "High seqno of each vbucket.", vb.high_seqno, bucket=name,
              vb=vbid, state=vb.state.name.lower())
    for vbid, vb in vbuckets:
        m.add("kv_vb_persisted_seqno", "gauge", "Seqno up to which each vbucket is persisted.",
              vb.persisted_seqno, bucket=name, vb=vbid)


def _dcp(m: Exposition, views) -> None:
    """The DCP connections' and their streams' (dcpview.py reads them)."""
    counts: dict[tuple[str, str], int] = {}
    for v in views:
        counts[(v.bucket, v.type)] = counts.get((v.bucket, v.type), 0) + 1
    for (bucket, kind), n in sorted(counts.items()):
        m.add("kv_dcp_connections", "gauge", "Open DCP connections by type.", n, bucket=bucket, type=kind)
    for v in views:
        labels = {"bucket": v.bucket, "connection": v.name, "type": v.type}
        if v.type == "producer":
            m.add("kv_dcp_items_remaining", "gauge", "Items a producer's streams have not yet taken from their "
                  "vbuckets (an upper bound; what they queued is in kv_dcp_stream_ready_queue_bytes).",
                  v.items_remaining, **labels)
            m.add("kv_dcp_items_sent", "counter", "Items a producer has sent.", v.items_sent, **labels)
        m.add("kv_dcp_total_data_size_bytes", "counter", "Bytes a DCP connection has sent (producer) or "
              "received (consumer).", v.bytes_moved, **labels)
        m.add("kv_dcp_flow_control_unacked_bytes", "gauge", "Bytes sent or received and not yet acknowledged "
              "under flow control.", v.unacked_bytes, **labels)
        m.add("kv_dcp_flow_control_buffer_bytes", "gauge", "The connection's flow-control buffer (0: none).",
              v.buffer_size, **labels)
    for v in views:
        for s in v.streams:
            labels = {"bucket": v.bucket, "connection": v.name, "vb": s.vb, "sid": s.sid}
            if v.type == "producer":
                m.add("kv_dcp_stream_items_remaining", "gauge", "Items a stream has not yet taken from its vbucket "
                      "(an upper bound: de-duplication may send fewer).", s.items_remaining, **labels)
                m.add("kv_dcp_stream_ready_queue_bytes", "gauge", "Bytes queued in a stream, ready to send.",
                      s.queue_bytes, **labels)
            m.add("kv_dcp_stream_last_seqno", "gauge", "The last seqno a stream queued to send (producer) or "
                  "received (consumer).", s.position, type=v.type, **labels)
    for v in views:
        if v.replication and v.type == "producer":
            m.add("kv_dcp_replication_lag_items", "gauge", "Items the replica at the other end of a replication "
                  "link is behind this node's active vbuckets.", v.items_remaining, bucket=v.bucket, link=v.name)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    user = require(request, "stats")
    text = collect(request.app[SERVER], lambda bucket: allowed(user, "bucket.stats", bucket)).render()
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})
