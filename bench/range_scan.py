"""KV range scans of a whole bucket through the official Python SDK (`collection.scan`), with every
document in memory and then with every document only on disk.

`--docs` (1M) JSON documents are loaded by `dcpflow load` into a `dcpflow server` with full eviction
and a quota that holds them all; the SDK scans the bucket (RangeScan over every vbucket, the raw
JSON transcoder, `--concurrency` vbuckets at a time) and every document must come back with its
value. The server is then restarted on the same data: full eviction's warm-up loads no document,
so the second scan reads every value from the store (engine/store_scan_reads.py), batched on a
worker thread, without paging any of them into memory. Printed: documents/s of each scan, the
ratio on disk / resident (the baseline is the first scan, measured in the same run), and the
server's RSS after each scan (the second must stay near the restarted server's own, not grow by
the bucket's size).

    .venv/bin/python bench/range_scan.py                 # 1,000,000 documents
    .venv/bin/python bench/range_scan.py --smoke         # 2,000 documents, seconds
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import child_env, start_server, stop  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def scan(port: int, concurrency: int) -> tuple[int, int, float]:
    """(documents, documents with an empty value, seconds) of one scan of the whole bucket."""
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
        began = time.monotonic()
        docs = empty = 0
        for result in coll.scan(RangeScan(), ScanOptions(transcoder=RawJSONTranscoder(), concurrency=concurrency,
                                                         batch_item_limit=500, batch_byte_limit=256 * 1024)):
            docs += 1
            empty += not result.content_as[bytes]
        return docs, empty, time.monotonic() - began
    finally:
        cluster.close()


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
    extra = ("--eviction-policy", "fullEviction", "--memory-quota", "4g")
    try:
        server, port = start_server(data, args.vbuckets, *extra)
        try:
            began = time.monotonic()
            subprocess.run([sys.executable, "-m", "dcpflow.cli", "load", "--connection", f"couchbase://127.0.0.1:{port}",
                            "--docs", str(args.docs)], check=True, stdout=subprocess.DEVNULL, env=child_env())
            print(f"loaded {args.docs:,} documents in {time.monotonic() - began:.1f} s; "
                  f"server RSS {rss_mib(server.pid):,.0f} MiB")
            resident = scan(port, args.concurrency)
            print(f"resident scan: {resident[0]:,} documents in {resident[2]:.1f} s = "
                  f"{resident[0] / resident[2]:,.0f}/s; server RSS {rss_mib(server.pid):,.0f} MiB")
        finally:
            stop(server)
        server, port = start_server(data, args.vbuckets, *extra)
        try:
            before = rss_mib(server.pid)
            on_disk = scan(port, args.concurrency)
            after = rss_mib(server.pid)
            print(f"on-disk scan (restarted, nothing resident): {on_disk[0]:,} documents in {on_disk[2]:.1f} s = "
                  f"{on_disk[0] / on_disk[2]:,.0f}/s; server RSS {before:,.0f} MiB before, {after:,.0f} MiB after")
        finally:
            stop(server)
        for name, (docs, empty, _) in (("resident", resident), ("on-disk", on_disk)):
            if docs != args.docs or empty:
                sys.exit(f"the {name} scan returned {docs:,} documents ({empty:,} empty) of {args.docs:,}")
        ratio = (on_disk[0] / on_disk[2]) / (resident[0] / resident[2])
        print(f"ratio on-disk/resident scan rate: {ratio:.2f}")
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
