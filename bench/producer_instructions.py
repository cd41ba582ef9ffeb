"""Instructions per streamed item of the DCP producer, counted by valgrind (callgrind), in process.

Wall-clock figures on a shared machine move by a third between identical runs; instruction counts
do not, so this tells whether a change to the producer's send loop or per-item encoding helps. A
`Server` with one `Connection` on a fake transport (it parses what the producer writes and sends
BUFFER_ACKs at a fifth of the window, as a consumer would) is driven over the wire protocol only -
SASL, SELECT_BUCKET, DCP_OPEN, DCP_CONTROL, STREAM_REQ, BUFFER_ACK - so the same script measures
any source tree. Cases, over 16 vbuckets:

* memory - N plain 100-byte mutations in the checkpoints (the compiled run encoder);
* deletions - N deletions in the checkpoints (per-item packing);
* large - N 4000-byte values (sent uncopied after their header);
* backfill - N plain mutations from the on-disk store (encoded pages);
* backfill-mixed - the same with every third document deleted (rows and encoded pages);
* backfill-filtered - N plain mutations from the on-disk store in two user collections, taken
                   in turn, streamed with a filter on the first (half sent: per document walked);
* flow - as memory, through a 64 KiB window (many small send passes).

Each case runs four times under callgrind: setup only and setup plus streaming, with N and 4N
items; per item = ((stream 4N - stream N) - (setup 4N - setup N)) / 3N, the work of streaming
alone (not the writes that made the items, the warm-up or the start-up). The harness's own parsing
is in both trees' figures alike.

    .venv/bin/python bench/producer_instructions.py                              # this checkout
    .venv/bin/python bench/producer_instructions.py --baseline /tmp/base/src     # and a baseline
    .venv/bin/python bench/producer_instructions.py --cases memory,flow --items 1000
    .venv/bin/python bench/producer_instructions.py --smoke   # seconds: the memory case, N=100

--smoke checks that the bench works end to end in seconds: the memory case's workloads with 100
items, this checkout only, run as the counted runs would but outside valgrind (a counted run spends
most of a minute starting Python under valgrind), so nothing is counted.

Needs valgrind (Debian: apt-get install valgrind). A few minutes per case and source tree.
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VBS = 16
CASES = ("memory", "deletions", "large", "backfill", "backfill-mixed", "backfill-filtered", "flow")


class _Transport:
    """Takes what the producer writes (write and writelines) and hands it to `sink`."""

    def __init__(self, sink):
        self.sink = sink

    def write(self, data) -> None:
        self.sink(data)

    def writelines(self, parts) -> None:
        for part in parts:
            self.sink(part)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default=None):
        return default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def build(data_dir: str, n: int, case: str) -> None:
    """The on-disk store of a backfill case (outside valgrind)."""
    from dcpflow.engine import Bucket, VBucketState
    with Bucket("default", data_dir, VBS, synchronous="OFF") as bucket:
        for vb in range(VBS):
            bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
        cids = (0,)
        if case == "backfill-filtered":
            bucket.change_manifest(lambda m: m.add_scope("s"))
            bucket.change_manifest(lambda m: m.add_collection("s", "c0"))
            bucket.change_manifest(lambda m: m.add_collection("s", "c1"))
            cids = tuple(bucket.manifest.collection("s", c).uid for c in ("c0", "c1"))
        for i in range(n):
            key = b"key-%08d" % i
            cid = cids[i % len(cids)]
            bucket.vbucket(i % VBS).set((cid, key) if cid else key, b"x" * 100)
            if case == "backfill-mixed" and i % 3 == 0:
                bucket.vbucket(i % VBS).delete(b"key-%08d" % i)


def workload(case: str, n: int, stream: bool, data_dir: str) -> None:
    """Set the case up with `n` items, stream every vbucket to its end if `stream`, then exit at
    once (no teardown to count)."""
    from dcpflow.protocol import dcp
    from dcpflow.protocol.frame import Magic, request
    from dcpflow.protocol.hello import Feature
    from dcpflow.protocol.opcodes import Opcode
    from dcpflow.server import connection
    from dcpflow.server.app import Server, ServerConfig
    from dcpflow.server.connection import Connection

    connection.MAX_PASS_SECONDS = float("inf")  # valgrind is ~50x slower: no pass cut by the clock
    body_length = struct.Struct(">I").unpack_from
    request_magic, response_magic = int(Magic.REQUEST), int(Magic.RESPONSE)  # plain ints: cheap to compare
    stream_end, noop = int(Opcode.DCP_STREAM_END), int(Opcode.DCP_NOOP)
    window = 64 * 1024 if case == "flow" else 10 * 1024 * 1024

    async def main() -> None:
        server = Server(ServerConfig(data_dir=data_dir, port=0, plain_over_tcp=True, flush_interval=1000,
                                     num_vbuckets=VBS, checkpoint_max_items=10_000_000,
                                     compaction_interval=10_000, expiry_interval=10_000))
        await server.start()
        conn = Connection(server)
        state = {"buf": bytearray(), "ends": 0, "unacked": 0}
        done = asyncio.get_running_loop().create_future()

        def sink(data) -> None:
            buf = state["buf"]
            buf += data
            pos, ends, unacked = 0, state["ends"], state["unacked"]
            while len(buf) - pos >= 24:
                size = 24 + body_length(buf, pos + 8)[0]
                if len(buf) - pos < size:
                    break
                magic, opcode = buf[pos], buf[pos + 1]
                if magic == request_magic and opcode == stream_end:
                    ends += 1
                if magic != response_magic and opcode != noop:
                    unacked += size  # what the producer charged
                pos += size
            del buf[:pos]
            state["ends"] = ends
            if unacked >= window // 5:
                conn.data_received(dcp.DcpBufferAck(unacked).encode())
                unacked = 0
            state["unacked"] = unacked
            if ends >= VBS and not done.done():
                done.set_result(None)

        conn.connection_made(_Transport(sink))
        conn.data_received(request(Opcode.SASL_AUTH, key=b"PLAIN", value=b"\0Administrator\0password") +
                           request(Opcode.SELECT_BUCKET, key=b"default"))
        engine = server.buckets["default"].engine
        if not case.startswith("backfill"):
            value = b"x" * (4000 if case == "large" else 100)
            for i in range(n):
                engine.vbucket(i % VBS).set(b"key-%08d" % i, value)
                if case == "deletions":
                    engine.vbucket(i % VBS).delete(b"key-%08d" % i)
        if stream:
            value = b""
            if case == "backfill-filtered":  # a collection-aware connection, filtered on the first collection
                conn.data_received(request(Opcode.HELLO, key=b"icount", value=struct.pack(">H", Feature.COLLECTIONS)))
                value = json.dumps({"collections": [format(engine.manifest.collection("s", "c0").uid, "x")]}).encode()
            conn.data_received(dcp.DcpOpen(b"icount", dcp.OpenFlag.PRODUCER).encode() +
                               dcp.DcpControl(b"connection_buffer_size", str(window).encode()).encode())
            if value:  # collections need noops (stream-request.md); at this interval none is sent
                conn.data_received(dcp.DcpControl(b"enable_noop", b"true").encode() +
                                   dcp.DcpControl(b"set_noop_interval", b"3600").encode())
            conn.data_received(b"".join(dcp.DcpStreamRequest(vb, 0, engine.vbucket(vb).high_seqno, 0, 0, 0, 0,
                                                             value, opaque=vb + 1).encode() for vb in range(VBS)))
            await done
        os._exit(0)

    asyncio.run(main())


def count(src: str, case: str, n: int, stream: bool, template: str) -> int:
    data_dir = tempfile.mkdtemp(prefix="dcpflow-icount-")
    shutil.rmtree(data_dir)
    shutil.copytree(template, data_dir)
    env = dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0")
    try:
        out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                              __file__, "--child", case, str(n), str(int(stream)), data_dir],
                             env=env, capture_output=True, text=True)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    match = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0:  # callgrind counts a workload that failed too: that count means nothing
        raise RuntimeError(f"the {case} x{n} workload failed under {src}:\n{out.stderr[-2000:]}")
    if not match:
        raise RuntimeError(f"callgrind gave no count for {case} x{n} ({src}):\n{out.stderr[-2000:]}")
    return int(match.group(1))


def per_item(src: str, case: str, n: int) -> float:
    templates = {}
    try:
        for k in (n, 4 * n):
            templates[k] = tempfile.mkdtemp(prefix="dcpflow-icount-data-")
            if case.startswith("backfill"):
                subprocess.run([sys.executable, __file__, "--build", case, str(k), templates[k]],
                               env=dict(os.environ, PYTHONPATH=src), check=True)
        runs = [(n, False), (4 * n, False), (n, True), (4 * n, True)]
        with ThreadPoolExecutor(2) as pool:  # callgrind is single-threaded: two at a time on two cores
            a, b, c, d = pool.map(lambda r: count(src, case, r[0], r[1], templates[r[0]]), runs)
    finally:
        for t in templates.values():
            shutil.rmtree(t, ignore_errors=True)
    return ((d - c) - (b - a)) / (3 * n)


def smoke(case: str, n: int) -> int:
    """Run a case's workloads as the counted runs would, outside valgrind: the bench's code runs end
    to end in seconds, and nothing is counted."""
    from serverproc import child_env

    env = child_env()
    for stream in (False, True):
        with tempfile.TemporaryDirectory(prefix="dcpflow-icount-") as tmp:
            subprocess.run([sys.executable, __file__, "--child", case, str(n), str(int(stream)), tmp], env=env,
                           check=True)
    print(f"instructions per streamed item: {case} workload ran uncounted (N={n})")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", metavar="SRC", help="another tree's src directory, counted in the same run")
    p.add_argument("--items", type=int, default=2000, help="N (default 2000)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--build", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run that checks the bench works (nothing is counted)")
    args = p.parse_args()
    if args.child:
        case, n, stream, data_dir = args.child
        workload(case, int(n), stream == "1", data_dir)
        return 0
    if args.build:
        case, n, data_dir = args.build
        build(data_dir, int(n), case)
        return 0
    if args.smoke:
        return smoke("memory", 100)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: apt-get install -y valgrind", file=sys.stderr)
        return 2
    cases = args.cases.split(",")
    unknown = set(cases) - set(CASES)
    if unknown:
        p.error(f"unknown case(s) {', '.join(sorted(unknown))}; choose from {', '.join(CASES)}")
    trees = {"this checkout": str(ROOT / "src")}
    if args.baseline:
        trees["baseline"] = str(Path(args.baseline).resolve())
    print(f"instructions per streamed item (callgrind; {VBS} vbuckets, N={args.items:,})")
    for case in cases:
        figures = {name: per_item(src, case, args.items) for name, src in trees.items()}
        line = "  ".join(f"{name} {n:>9,.0f}" for name, n in figures.items())
        if args.baseline:
            line += f"  ratio {figures['this checkout'] / figures['baseline']:.3f}"
        print(f"  {case:15s} {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
