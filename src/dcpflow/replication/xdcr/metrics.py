"""The replicator's own `GET /metrics` (Prometheus text format 0.0.4), for `dcpflow xdcr
--metrics-port`. The replicator is a process of its own, beside the clusters it joins, so its
stats are served here (and written to status.json), not by the servers' management ports.

Names follow Couchbase's XDCR metrics
(https://docs.couchbase.com/server/current/metrics-reference/xdcr-metrics.html): xdcr_docs_written_total,
xdcr_docs_failed_cr_source_total, xdcr_docs_failed_cr_target_total, xdcr_docs_filtered_total,
xdcr_changes_left_total, xdcr_docs_received_from_dcp_total, xdcr_wtavg_docs_latency_seconds;
dcpflow's own carry the dcpflow_ prefix. Every series has the sourceBucketName and
targetBucketName labels.
"""

from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: stat -> (metric name, type, help)
METRICS = {
    "docs_written": ("xdcr_docs_written_total", "counter", "Documents the target accepted"),
    "docs_received": ("xdcr_docs_received_from_dcp_total", "counter", "Changes read from the source"),
    "failed_cr_source": ("xdcr_docs_failed_cr_source_total", "counter",
                         "Documents not sent: the target's version won at the source (GET_META)"),
    "failed_cr_target": ("xdcr_docs_failed_cr_target_total", "counter",
                         "Documents the target refused: its version won conflict resolution"),
    "docs_filtered": ("xdcr_docs_filtered_total", "counter", "Changes the filters left out"),
    "changes_left": ("xdcr_changes_left_total", "gauge", "Source changes not yet replicated (at the last checkpoint)"),
    "docs_failed": ("dcpflow_xdcr_docs_failed_total", "counter", "Changes the target refused for good"),
    "source_rollbacks": ("dcpflow_xdcr_source_rollbacks_total", "counter", "Source streams rolled back"),
    "target_rewinds": ("dcpflow_xdcr_target_rewinds_total", "counter",
                       "Times the target lost writes and they were sent again"),
    "docs_resent": ("dcpflow_xdcr_docs_resent_total", "counter", "Changes sent again in this run"),
    "checkpoints": ("dcpflow_xdcr_checkpoints_total", "counter", "Checkpoints saved"),
    "docs_other_collections": ("dcpflow_xdcr_docs_other_collections_total", "counter",
                               "Changes skipped: the target had no collection of their name (sent once it has)"),
    "docs_backfilled": ("dcpflow_xdcr_docs_backfilled_total", "counter",
                        "Changes sent again for a collection the target gained"),
}


def render(stats: dict, source_bucket: str, target_bucket: str) -> str:
    labels = f'sourceBucketName="{_escape(source_bucket)}",targetBucketName="{_escape(target_bucket)}"'
    lines = []
    for stat, (name, kind, text) in METRICS.items():
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {stats.get(stat, 0)}"]
    name = "xdcr_wtavg_docs_latency_seconds"
    lines += [f"# HELP {name} Time the last batch took to be written", f"# TYPE {name} gauge",
              f"{name}{{{labels}}} {stats.get('latency_ms_last', 0) / 1000:.6f}"]
    return "\n".join(lines) + "\n"


def _escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


async def serve(replicator, host: str, port: int) -> web.AppRunner:
    """Serve the replicator's stats on host:port until the returned runner is cleaned up."""

    async def metrics(_request):
        source = replicator.source.bucket if replicator.source else ""
        target = replicator.target.client.bucket if replicator.target else ""
        return web.Response(body=render(replicator.stats, source, target).encode(),
                            headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
