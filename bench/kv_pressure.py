"""Writes under memory pressure: `--docs` unique documents of `--value-size` bytes loaded into a
bucket whose quota (`--memory-quota`) is far smaller than the data, against the same load into a
bucket without a quota, each against a fresh `dcpflow server` subprocess, in the same run.

With a quota, every value must be written by the flusher before the item pager may evict it, so
the load can go no faster than the store writes; what this measures is whether it goes that fast.
Each load is `load_docs` of bench/kv_memory.py (windows of 64 on one connection, an ETMPFAIL retried
after 10 ms as the SDKs back off); the load ends when the last SET is acknowledged. Printed per
load: SETs/s, ETMPFAIL replies, the server's CPU seconds, and from its stats the values ejected
and items persisted when the last SET was acknowledged; then how long until the flusher had written
everything, as documents/s from the first SET (without a quota: the store's speed on this data,
the most a load into a quota can reach); then the ratios quota/no quota and quota/store speed.

    .venv/bin/python bench/kv_pressure.py                                  # 1M x 4 KB into 1 GiB
    .venv/bin/python bench/kv_pressure.py --docs 150000 --memory-quota 256m
    .venv/bin/python bench/kv_pressure.py --smoke       # seconds: 6,000 x 4 KB into 16 MiB
"""

import argparse
import sys
import tempfile
import time

from kv import Client, random_value
from kv_memory import load_docs
from serverproc import cpu_seconds, start_server, stop

MiB = 1 << 20


def load(args, quota: str) -> dict:
    """One load into a fresh server with `quota` ("unlimited" for none): its figures."""
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        proc, port = start_server(tmp, args.vbuckets, "--allow-plain-over-tcp", "--memory-quota", quota)
        try:
            client = Client.logged_in(port)
            value = random_value(args.value_size)
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()

            def progress(done: int, refused: int) -> None:
                took = time.monotonic() - t0
                print(f"  {quota}: {done:,} SET in {took:.0f} s ({done / took:,.0f}/s), {refused:,} ETMPFAIL",
                      flush=True)

            done, refused = load_docs(client, args.docs, value, args.vbuckets, 10_000,
                                      progress if args.progress else None)
            took = time.monotonic() - t0
            cpu = cpu_seconds(proc.pid) - cpu0
            stats = client.stats()
            # how long until the flusher has written everything: the store's speed on this data
            persisted = took + client.settle(3600)
            return {"took": took, "rate": done / took, "refused": refused, "cpu": cpu, "store_rate": done / persisted,
                    "ejected": int(stats[b"ep_num_value_ejects"]), "persisted": int(stats[b"ep_total_persisted"]),
                    "queue": int(stats[b"ep_queue_size"]), "mem_used": int(stats[b"mem_used"]),
                    "quota": int(stats[b"ep_max_size"])}
        finally:
            stop(proc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=1_000_000, help="unique documents (default 1000000)")
    p.add_argument("--value-size", type=int, default=4096, help="value bytes (default 4096)")
    p.add_argument("--memory-quota", default="1g", help="the bucket's quota (default 1g)")
    p.add_argument("--vbuckets", type=int, default=1024)
    p.add_argument("--skip-baseline", action="store_true", help="only the load with a quota")
    p.add_argument("--progress", action="store_true", help="print the rate every 100k documents")
    p.add_argument("--smoke", action="store_true", help="a seconds-long run: 6,000 x 4 KB into 16 MiB, 64 vbuckets")
    args = p.parse_args()
    if args.smoke:
        args.docs, args.memory_quota, args.vbuckets = 6_000, "16m", 64
    runs = {} if args.skip_baseline else {"no quota": load(args, "unlimited")}
    runs[f"quota {args.memory_quota}"] = load(args, args.memory_quota)
    values = args.docs * args.value_size / MiB
    print(f"{args.docs:,} documents x {args.value_size} bytes ({values:,.0f} MiB of values), "
          f"{args.vbuckets} vbuckets, one connection, windows of 64")
    for name, r in runs.items():
        print(f"  {name:>12}: {r['rate']:>9,.0f} SETs/s ({r['took']:.1f} s, server CPU {r['cpu']:.1f} s), "
              f"ETMPFAIL {r['refused']:,}, values ejected {r['ejected']:,}, persisted {r['persisted']:,} "
              f"(queue {r['queue']:,}), mem_used {r['mem_used'] / MiB:,.0f} MiB; all persisted at "
              f"{r['store_rate']:,.0f} docs/s")
    if len(runs) == 2:
        base, pressed = runs.values()
        print(f"ratio quota/no quota: {pressed['rate'] / base['rate']:.2f}; quota load / the store's speed without "
              f"a quota (first SET to all persisted): {pressed['rate'] / base['store_rate']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
