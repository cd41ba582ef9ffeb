"""KV range scans of a whole bucket through the official Python SDK (`collection.scan`), with every
document in memory and then with every document only on disk.

`--docs` (1M) JSON documents are loaded by `dcpflow load` into a `dcpflow server` with full
eviction and a quota that holds them all and persisted (the flusher done, so it does not share the
machine with the scan); the SDK scans the bucket (RangeScan over every vbucket, the raw JSON
transcoder, `--concurrency` vbuckets at a time) and every document must come back with its value.
The server is then restarted on the same data: full eviction's warm-up loads no document, so the
second scan reads every value from the store (engine/store_scan_reads.py), batched on a worker
thread, without paging any of them into memory. Printed: documents/s of each scan and the CPU
seconds the server and the SDK's process spent on it, the ratios on disk / resident of the rate and
of the server's CPU per document (the baseline is the first scan, measured in the same run; the
rate is mostly the SDK's: its process spends more CPU than the server), and the server's RSS after
each scan (the second must stay near the restarted server's own, not grow by the bucket's size).

    .venv/bin/python bench/range_scan.py                 # 1,000,000 documents
    .venv/bin/python bench/range_scan.py --smoke         # 2,000 documents, seconds
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv import Client  # noqa: E402
from serverproc import child_env, cpu_seconds, start_server, stop  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def scan(port: int, concurrency: int, server_pid: int) -> tuple[int, int, float, float, float]:
    """(documents, documents with an empty value, seconds, the server's CPU seconds, this process's
    CPU seconds: the SDK's) of one scan of the whole bucket."""
    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster
    from couchbase.kv_range_scan import RangeScan
    from couchbase.options import ClusterOptions, ClusterTimeoutOptions, ScanOptions
    from couchbase.transcoder import RawJSONTranscoder

    cluster = Cluster(f"couchbase://127.0.0.1:{port}", ClusterOptions(
        PasswordAuthenticator("Administrator", "password"),
        timeout_options=ClusterTimeoutOptions(kv_scan_timeout=timedelta(seconds=600))))
    try:
        coll = cluster.bucket("default").default_collection()
        began, server_cpu, own_cpu = time.monotonic(), cpu_seconds(server_pid), sum(os.times()[:2])
        docs = empty = 0
        for result in coll.scan(RangeScan(), ScanOptions(transcoder=RawJSONTranscoder(), concurrency=concurrency,
                                                         batch_item_limit=500, batch_byte_limit=256 * 1024)):
            docs += 1
            empty += not result.content_as[bytes]
        return (docs, empty, time.monotonic() - began, cpu_seconds(server_pid) - server_cpu,
                sum(os.times()[:2]) - own_cpu)
    finally:
        cluster.close()


def report(result: tuple) -> str:
    docs, _, took, server_cpu, own_cpu = result
    return (f"{docs:,} documents in {took:.1f} s = {docs / took:,.0f}/s; server CPU {server_cpu:.1f} s "
            f"({server_cpu / docs * 1e6:.1f} µs/document), the SDK's process {own_cpu:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="2,000 documents, 64 vbuckets")
    args = ap.parse_args()
    if args.smoke:
        args.docs, args.vbuckets = 2000, 64
    data = tempfile.mkdtemp(prefix="bench-range-scan-")
    extra = ("--allow-plain-over-tcp", "--eviction-policy", "fullEviction", "--memory-quota", "4g")  # PLAIN: kv.Client
    try:
        server, port = start_server(data, args.vbuckets, *extra)
        try:
            began = time.monotonic()
            subprocess.run([sys.executable, "-m", "dcpflow.cli", "load", "--connection", f"couchbase://127.0.0.1:{port}",
                            "--docs", str(args.docs)], check=True, stdout=subprocess.DEVNULL, env=child_env())
            loaded = time.monotonic() - began
            # the flusher done first, so the resident scan does not share the machine with it
            client = Client.logged_in(port)
            settled = client.settle(600)
            client.sock.close()
            print(f"loaded {args.docs:,} documents in {loaded:.1f} s, all persisted {settled:.1f} s later; "
                  f"server RSS {rss_mib(server.pid):,.0f} MiB")
            resident = scan(port, args.concurrency, server.pid)
            print(f"resident scan: {report(resident)}; server RSS {rss_mib(server.pid):,.0f} MiB")
        finally:
            stop(server)
        server, port = start_server(data, args.vbuckets, *extra)
        try:
            before = rss_mib(server.pid)
            on_disk = scan(port, args.concurrency, server.pid)
            after = rss_mib(server.pid)
            print(f"on-disk scan (restarted, nothing resident): {report(on_disk)}; server RSS {before:,.0f} MiB "
                  f"before, {after:,.0f} MiB after")
        finally:
            stop(server)
        for name, (docs, empty, *_) in (("resident", resident), ("on-disk", on_disk)):
            if docs != args.docs or empty:
                sys.exit(f"the {name} scan returned {docs:,} documents ({empty:,} empty) of {args.docs:,}")
        ratio = (on_disk[0] / on_disk[2]) / (resident[0] / resident[2])
        cpu_ratio = (on_disk[3] / on_disk[0]) / (resident[3] / resident[0])
        print(f"ratio on-disk/resident scan rate: {ratio:.2f}; "
              f"server CPU per document on-disk/resident: {cpu_ratio:.2f}")
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
