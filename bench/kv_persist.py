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

Both report the persistence backlog: STAT ep_queue_size (writes acknowledged, not yet on disk)
sampled every 0.1 s while the client writes - its largest value, that value in seconds of the
writes acknowledged meanwhile, and how long the queue took to empty once the client stopped. The
target: the backlog never exceeds the checkpoint quota (30% of the bucket's memory quota: writes
past it get ETMPFAIL) and never holds more than 2 seconds of writes. The storm runs with the
server's default quota (100 MiB) unless `--memory-quota` says otherwise; the load with 1g, which
holds its documents (the default would refuse some with ETMPFAIL, which this client does not retry).

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


class Backlog:
    """STAT ep_queue_size every `interval` seconds on a connection of its own, in a thread, until
    `stop()`; then `drain()` waits for the queue to empty."""

    def __init__(self, port: int, interval: float = 0.1):
        self.client, self.interval = Client.logged_in(port), interval
        self.largest = self.at_stop = 0
        self.quota = self.checkpoint = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stopping.is_set():
            stats = self.client.stats()
            self.largest = max(self.largest, int(stats[b"ep_queue_size"]))
            self.checkpoint = max(self.checkpoint, int(stats.get(b"ep_checkpoint_memory", b"0")))
            self.quota = int(stats.get(b"ep_checkpoint_memory_quota", b"0"))
            self._stopping.wait(self.interval)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self.at_stop = int(self.client.stats()[b"ep_queue_size"])
        self.largest = max(self.largest, self.at_stop)

    def drain(self, timeout: float = 600) -> float:
        """Seconds until every acknowledged write is persisted."""
        return self.client.settle(timeout)

    def report(self, writes_per_second: float, drained: float) -> str:
        quota = f"{self.quota / 2**20:.0f} MiB" if self.quota else "none"
        return (f"  persistence backlog: largest {self.largest:,} items ({self.largest / writes_per_second:.2f} s of "
                f"writes), {self.at_stop:,} when the writes stopped, all persisted {drained:.2f} s later "
                f"(checkpoint memory at most {self.checkpoint / 2**20:.1f} MiB of its quota {quota})")


def quota_args(args, default: str | None) -> tuple[str, ...]:
    quota = args.memory_quota or default
    return ("--memory-quota", quota) if quota else ()


def storm(args) -> None:
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        # the server's own default quota (serverproc passes `unlimited` unless told otherwise)
        proc, port = start_server(tmp, args.vbuckets, "--allow-plain-over-tcp", *quota_args(args, "100m"))
        try:
            writer, observer = Client.logged_in(port), Client.logged_in(port)
            keys = [b"bench-key-%08d" % i for i in range(args.keys)]
            value = random_value(args.value_size)
            wins = windows(Opcode.SET, keys, value, 64, args.vbuckets)
            run_phase(writer, wins, len(keys), 1)  # every key exists
            observer.settle(600)
            deadline = time.monotonic() + args.seconds
            done = [0]
            backlog = Backlog(port)
            started = time.monotonic()

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
            backlog.stop()
            rate = done[0] / (time.monotonic() - started)
            drained = backlog.drain()
            busy = sorted(((c1[t] - c0.get(t, 0.0)) / elapsed for t in c1), reverse=True)
            print(f"storm: {args.keys:,} keys, {args.value_size}-byte values, {elapsed:.1f} s sampled")
            print(f"  SETs/s {(d1 - d0) / elapsed:,.0f}   rows persisted/s {(p1 - p0) / elapsed:,.0f}   "
                  f"server threads' CPU (cores, busiest first) {', '.join(f'{b:.2f}' for b in busy[:3])}")
            print(backlog.report(rate, drained))
        finally:
            stop(proc)


def load(args) -> None:
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        proc, port = start_server(tmp, args.vbuckets, "--allow-plain-over-tcp", *quota_args(args, "1g"))
        try:
            client = Client.logged_in(port)
            keys = [b"doc-%09d" % i for i in range(args.docs)]
            value = random_value(args.value_size)
            wins = windows(Opcode.SET, keys, value, 64, args.vbuckets)
            backlog = Backlog(port)
            t0 = time.perf_counter()
            run_phase(client, wins, len(keys), 2)
            acked = time.perf_counter() - t0
            backlog.stop()
            drained = backlog.drain()
            persisted = time.perf_counter() - t0
            print(f"load: {args.docs:,} unique {args.value_size}-byte documents")
            print(f"  acknowledged in {acked:.1f} s ({args.docs / acked:,.0f} SETs/s), "
                  f"all persisted {persisted:.1f} s after the first ({args.docs / persisted:,.0f} docs/s)")
            print(backlog.report(args.docs / acked, drained))
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
    p.add_argument("--memory-quota", metavar="SIZE",
                   help="the bucket's quota, as the server takes it (default: storm 100m, the server's; load 1g)")
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
