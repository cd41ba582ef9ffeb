"""Instructions per SET and GET on the server's request path, counted by valgrind (callgrind).

Wall-clock figures on a busy 2-core VM move by a third between identical runs; instruction counts
do not, so this is the way to tell whether a change to the hot path helps. The workload runs in
process: a `Server` with one `Connection` on a fake transport is fed pre-encoded windows of 64
requests (as `bench/kv.py` sends them) over 2,000 keys (`--keys`). Each case runs twice under callgrind, with 1
and with 4 passes over the keys; the difference divided by the extra operations is the per-operation
count, free of start-up and import costs.

    .venv/bin/python bench/kv_instructions.py                          # this checkout
    .venv/bin/python bench/kv_instructions.py --baseline /tmp/base/src  # and a baseline, same run
      (e.g. `git worktree add /tmp/base HEAD~1`; the ratio printed is this checkout / baseline)
    .venv/bin/python bench/kv_instructions.py --value 3fa2...          # SET another value (default x * 100)
    .venv/bin/python bench/kv_instructions.py --smoke                  # seconds: 64 keys, SET and GET, uncounted
    .venv/bin/python bench/kv_instructions.py --subdoc                 # SET, GET, mutate_in, lookup_in on JSON
      (documents of bench/kv.py --subdoc; mutate_in / lookup_in send one spec each, as an SDK's
      single-path call does)

Needs valgrind (Debian: apt-get install valgrind). About a minute per case and source tree.

--smoke checks that the bench works end to end in seconds: the SET and GET workloads of one
64-request window of keys on 16 vbuckets, this checkout only, run as the counted runs would but
outside valgrind (a counted run spends most of a minute starting Python under valgrind), so
nothing is counted.
"""

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = 2000
SHORT, LONG = 1, 4


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default=None):
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def workload(mode: str, passes: int, value: bytes, nkeys: int, vbuckets: int, data_dir: str) -> None:
    """Run `passes` passes of `mode` requests through a Connection, then exit at once (no teardown
    to count)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kv
    from dcpflow.protocol.frame import request
    from dcpflow.protocol.opcodes import Opcode
    from dcpflow.server import connection
    from dcpflow.server.app import Server, ServerConfig
    from dcpflow.server.connection import Connection

    # Valgrind runs the server ~50x slower: with the 4 ms pass budget every window would be cut into
    # passes that the real server (a window takes well under a millisecond) never makes.
    connection.MAX_PASS_SECONDS = float("inf")

    async def main() -> None:
        # Nothing that runs by the wall clock: under valgrind a run takes a minute or more, and how
        # long depends on the machine's load, so timers (the expiry pager over every vbucket, a
        # checkpoint closed for its age) would add a load-dependent count to every operation.
        server = Server(ServerConfig(data_dir=data_dir, port=0, plain_over_tcp=True, flush_interval=1000,
                                     num_vbuckets=vbuckets, expiry_interval=1e9))
        await server.start()
        for task in server._tasks:  # the item pager (every 0.1 s) and the log and fragmentation ticks
            if task.get_name() in ("dcpflow-item-pager", "dcpflow-log-summaries", "dcpflow-fragmentation"):
                task.cancel()  # wake by the wall clock: a load-dependent count (the flusher stays)
        for bucket in server.buckets.values():
            for vb in bucket.engine.vbuckets.values():
                vb.checkpoint_manager.max_age = None
                vb.checkpoint_manager.checkpoints[-1].deadline = float("inf")
        conn = Connection(server)
        conn.connection_made(_Transport())
        conn.data_received(request(Opcode.SASL_AUTH, key=b"PLAIN", value=b"\0Administrator\0password") +
                           request(Opcode.SELECT_BUCKET, key=b"default"))
        keys = [b"bench-key-%08d" % i for i in range(nkeys)]
        sets = kv.windows(Opcode.SET, keys, value, 64, vbuckets)
        gets = kv.windows(Opcode.GET, keys, b"", 64, vbuckets)
        for data, _ in sets:  # every key exists before counting starts
            conn.data_received(data)
            await asyncio.sleep(0)
        if mode in kv.SUBDOC_REQUESTS:
            opcode, body = kv.SUBDOC_REQUESTS[mode]
            windows = kv.windows(opcode, keys, body, 64, vbuckets)
        else:
            windows = sets if mode == "set" else gets
        for _ in range(passes):
            for data, _ in windows:
                conn.data_received(data)
                await asyncio.sleep(0)  # a pass that ran out of time goes on here, as it would in the server
        os._exit(0)

    asyncio.run(main())


def child_command(mode: str, passes: int, args) -> list[str]:
    """The workload's command line; its data dir is made (and removed) by the caller."""
    return [sys.executable, __file__, "--child", mode, str(passes), "--value", args.value, "--keys", str(args.keys),
            "--vbuckets", str(args.vbuckets)]


def count(src: str, mode: str, passes: int, args) -> int:
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONHASHSEED="0")  # the same dict layouts in every run
    with tempfile.TemporaryDirectory(prefix="dcpflow-icount-") as tmp:
        out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                              *child_command(mode, passes, args), "--data-dir", tmp],
                             env=env, capture_output=True, text=True)
    match = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0:  # callgrind counts a workload that failed too: that count means nothing
        raise RuntimeError(f"the {mode} x{passes} workload failed under {src}:\n{out.stderr[-2000:]}")
    if not match:
        raise RuntimeError(f"callgrind gave no count for {mode} x{passes} ({src}):\n{out.stderr[-2000:]}")
    return int(match.group(1))


def smoke(args, modes: tuple[str, ...]) -> int:
    """Run every case's workload as the counted runs would, outside valgrind: the bench's code runs
    end to end in seconds, and nothing is counted."""
    from serverproc import child_env

    env = child_env()
    for mode in modes:
        for passes in (SHORT, LONG):
            with tempfile.TemporaryDirectory(prefix="dcpflow-icount-") as tmp:
                subprocess.run([*child_command(mode, passes, args), "--data-dir", tmp], env=env, check=True)
        print(f"  {mode.upper()} workload: {args.keys} keys, {SHORT} and {LONG} passes ran")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", metavar="SRC", help="another tree's src directory, counted in the same run")
    p.add_argument("--value", default="x" * 100,
                   help="the SET value (default 100 x's); a value led by a digit, e, t, f or n takes the "
                        "JSON detection's longer path, e.g. --value 3f$(printf 'a%.0s' {1..98})")
    p.add_argument("--keys", type=int, default=KEYS, help=f"keys per pass (default {KEYS})")
    p.add_argument("--vbuckets", type=int, default=1024, help="vbuckets of the bucket (default 1024)")
    p.add_argument("--subdoc", action="store_true",
                   help="also count mutate_in / lookup_in; every value is then bench/kv.py's JSON document")
    p.add_argument("--data-dir", help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run that checks the bench works (nothing is counted)")
    p.add_argument("--child", nargs=2, metavar=("MODE", "PASSES"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        workload(args.child[0], int(args.child[1]), args.value.encode(), args.keys, args.vbuckets, args.data_dir)
        return 0
    modes = ("set", "get")
    if args.subdoc:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import kv
        modes = ("set", "get", "mutate_in", "lookup_in")
        args.value = kv.json_value(100).decode()
    if args.smoke:
        args.keys, args.vbuckets = 64, 16
        return smoke(args, modes)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: apt-get install -y valgrind", file=sys.stderr)
        return 2
    trees = {"this checkout": str(ROOT / "src")}
    if args.baseline:
        trees["baseline"] = str(Path(args.baseline).resolve())
    cases = [(name, src, mode) for name, src in trees.items() for mode in modes]
    runs = [(src, mode, passes) for _, src, mode in cases for passes in (SHORT, LONG)]
    with ThreadPoolExecutor(2) as pool:  # callgrind is single-threaded: two at a time on two cores
        counts = dict(zip(runs, pool.map(lambda r: count(*r, args), runs), strict=True))
    # per operation: the extra passes' count over their operations, free of start-up and imports
    results = {(name, src, mode): (counts[(src, mode, LONG)] - counts[(src, mode, SHORT)])
               / ((LONG - SHORT) * args.keys) for name, src, mode in cases}
    print(f"instructions per operation (callgrind; {args.keys:,} keys, {args.vbuckets} vbuckets, "
          f"64-request windows, "
          f"{len(args.value.encode())}-byte values starting {args.value[:8]!r})")
    for (name, _, mode), n in results.items():
        print(f"  {name:14s} {mode.upper():9s} {n:>9,.0f}")
    if args.subdoc:
        for name, src in trees.items():
            r = {mode: results[(name, src, mode)] for mode in modes}
            print(f"  {name}: mutate_in / SET = {r['mutate_in'] / r['set']:.2f}x instructions, "
                  f"lookup_in / GET = {r['lookup_in'] / r['get']:.2f}x")
    if args.baseline:
        for mode in modes:
            mine = results[("this checkout", trees["this checkout"], mode)]
            base = results[("baseline", trees["baseline"], mode)]
            print(f"  {mode.upper()} this checkout / baseline = {mine / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
