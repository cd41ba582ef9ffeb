"""SETs and the flusher beside them: what a write load costs `dcpflow server` once persistence runs.

bench/kv.py measures one-second SET phases that start with the flusher idle; a longer write load
meets the flusher writing SQLite on the same cores. Two cases, each against a fresh server:

* storm: the client SETs `--keys` hot keys (10k) for `--seconds` (9), windows of 64, two in
  flight; after 2 s of warm-up it samples 5 s: SETs/s, rows persisted/s (STAT
  ep_total_persisted), and each server thread's CPU (Linux /proc: the request thread, the flusher).
  The flusher de-duplicates: the faster it persists, the more rows (and CPU) the same SETs cost it.
  Rows are counted as each flush batch completes (up to 10k rows), so a 5 s sample moves in steps
  of ~2k rows/s: compare several runs.
* load: `--docs` unique documents (300k, `--value-size` 500 bytes) as fast as the client can, then
  the time until all are persisted (STAT ep_queue_size 0): the durability side of the same trade.

    .venv/bin/python bench/kv_persist.py                 # both cases
    .venv/bin/python bench/kv_persist.py --case storm --seconds 15
    .venv/bin/python bench/kv_persist.py --smoke        # seconds: 200 hot keys for 2 s, 2,000 documents
"""

import argparse
import sys
import tempfile
import threading
import time

from dcpflow.protocol.opcodes import Opcode
from kv import Client, random_value, run_phase, windows
from serverproc import start_server, stop, thread_cpu_seconds


def connect(port: int) -> Client:
    client = Client(port)
    client.login("Administrator", "password", "default")
    return client


def storm(args) -> None:
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        proc, port = start_server(tmp, args.vbuckets, "--allow-plain-over-tcp")
        try:
            writer, observer = connect(port), connect(port)
            keys = [b"bench-key-%08d" % i for i in range(args.keys)]
            value = random_value(args.value_size)
            wins = windows(Opcode.SET, keys, value, 64, args.vbuckets)
            run_phase(writer, wins, len(keys), 1)  # every key exists
            deadline = time.monotonic() + args.seconds
            done = [0]

            def load() -> None:
                while time.monotonic() < deadline:
                    run_phase(writer, wins, args.chunk, 2)
                    done[0] += args.chunk

            thread = threading.Thread(target=load)
            thread.start()
            time.sleep(args.warmup)
            sample = min(5.0, args.seconds - args.warmup - 1)
            p0, c0, d0 = int(observer.stats()[b"ep_total_persisted"]), thread_cpu_seconds(proc.pid), done[0]
            t0 = time.monotonic()
            time.sleep(sample)
            p1, c1, d1 = int(observer.stats()[b"ep_total_persisted"]), thread_cpu_seconds(proc.pid), done[0]
            elapsed = time.monotonic() - t0
            thread.join()
            busy = sorted(((c1[t] - c0.get(t, 0.0)) / elapsed for t in c1), reverse=True)
            print(f"storm: {args.keys:,} keys, {args.value_size}-byte values, {elapsed:.1f} s sampled")
            print(f"  SETs/s {(d1 - d0) / elapsed:,.0f}   rows persisted/s {(p1 - p0) / elapsed:,.0f}   "
                  f"server threads' CPU (cores, busiest first) {', '.join(f'{b:.2f}' for b in busy[:3])}")
        finally:
            stop(proc)


def load(args) -> None:
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        proc, port = start_server(tmp, args.vbuckets, "--allow-plain-over-tcp")
        try:
            client = connect(port)
            keys = [b"doc-%09d" % i for i in range(args.docs)]
            value = random_value(args.value_size)
            wins = windows(Opcode.SET, keys, value, 64, args.vbuckets)
            t0 = time.perf_counter()
            run_phase(client, wins, len(keys), 2)
            acked = time.perf_counter() - t0
            client.settle(600)
            persisted = time.perf_counter() - t0
            print(f"load: {args.docs:,} unique {args.value_size}-byte documents")
            print(f"  acknowledged in {acked:.1f} s ({args.docs / acked:,.0f} SETs/s), "
                  f"all persisted {persisted:.1f} s after the first ({args.docs / persisted:,.0f} docs/s)")
        finally:
            stop(proc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=("storm", "load", "both"), default="both")
    p.add_argument("--keys", type=int, default=10_000, help="storm: hot keys (default 10000)")
    p.add_argument("--seconds", type=float, default=9.0, help="storm: length of the load (default 9, at least 4)")
    p.add_argument("--docs", type=int, default=300_000, help="load: unique documents (default 300000)")
    p.add_argument("--value-size", type=int, default=None, help="value bytes (default: storm 100, load 500)")
    p.add_argument("--vbuckets", type=int, default=1024)
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run that checks the bench works: 200 keys for 2 s, 2,000 documents")
    args = p.parse_args()
    args.warmup, args.chunk = 2.0, 20_000  # storm: seconds before the sample; SETs per load step
    if args.smoke:
        args.keys, args.seconds, args.docs, args.vbuckets = 200, 2.0, 2_000, 64
        args.warmup, args.chunk = 0.5, 1_000
    elif args.seconds < 4:
        p.error("--seconds must be at least 4 (2 s of warm-up, then the sample)")
    size = args.value_size
    if args.case in ("storm", "both"):
        args.value_size = size or 100
        storm(args)
    if args.case in ("load", "both"):
        args.value_size = size or 500
        load(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
