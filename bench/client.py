"""DCP client throughput: the batch API and the event API against the loopback limit, one run.

A data dir with N small documents is built with the engine (and flushed), then `dcpflow server`
(a subprocess) serves it, and everything is read from seqno 0 to the high seqnos (a disk backfill)
four ways:

* batches  - `DcpClient.batches()`: Arrow record batches (max_rows 65536), rows counted;
* events   - `DcpClient.events()`: one Mutation object per document;
* sid      - the batch API on a client with `stream_ids=True` (its reads share a connection, each
             message framed with a stream-id that the client strips before decoding);
* tail     - `dcpflow tail URL --until now`: in this process (the `tail()` coroutine writing to
             a sink that counts the lines and keeps nothing) against the batch API's drain of
             the same run (the target is within 1.5x), and as a user runs it, `> /dev/null` (a
             subprocess: Python's start-up and the imports of pyarrow and numpy included);
* raw      - a plain socket with the same DCP_OPEN / controls / stream requests that reads the same
             number of stream bytes without decoding anything (it acks what it reads): the limit
             of server + loopback for this workload;
* decode   - the client's own work alone: the bytes the raw reader received, fed to the client's
             connection walker and Arrow decoder in-process (no socket, no server).

and, on the same server:

* mitigated - `events()` with rollback mitigation (`mitigate_rollbacks=True`) over the same
             backfill, against the plain event API (everything is persisted: what it costs when
             nothing waits for the disk);
* groups   - a static consumer group of 1, 2 and 3 `dcpflow tail --group --member I --of N --until
             now > /dev/null` processes draining the bucket together (whole-process time, from the
             first start to the last exit), against one `dcpflow tail` process;
* latency  - documents written at a steady --rate for --latency-seconds, each carrying its write
             time; a plain reader and a mitigated one (polling every --poll s) from "now": the
             delivery latency p50 / p99 of each, and what mitigation adds (the server's persistence
             latency plus the poll).

Then, unless --rss-docs 0, peak RSS of a separate process that streams --rss-docs documents with
the batch API and with the event API (VmRSS sampled every 0.25 s; the target is flat and under
200 MB whatever the backlog, because flow control bounds what the client holds).

    .venv/bin/python bench/client.py                          # 1M docs, 60-byte values, 64 vbuckets, best of 3
    .venv/bin/python bench/client.py --docs 200000 --rss-docs 0
    .venv/bin/python bench/client.py --docs 1000000 --rss-docs 10000000
    .venv/bin/python bench/client.py --smoke                  # seconds: 2,000 docs, 8 vbuckets, one round
"""

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dcpflow.client import DcpClient, Mutation, Offset  # noqa: E402
from dcpflow.protocol import dcp  # noqa: E402
from dcpflow.protocol.dcp import OpenFlag, StreamFlag  # noqa: E402
from dcpflow.protocol.frame import FrameDecoder, request  # noqa: E402
from dcpflow.protocol.hello import Feature  # noqa: E402
from dcpflow.protocol.opcodes import Opcode  # noqa: E402
from dcpflow.protocol.status import Status  # noqa: E402
from serverproc import build_data as build_data_here  # noqa: E402
from serverproc import call, child_env, start_server, stop  # noqa: E402

USER, PASSWORD = "Administrator", "password"


def build_data(data_dir: str, docs: int, value_size: int, vbuckets: int) -> dict[int, int]:
    """Build in a child process: millions of engine objects in this one would make the garbage
    collector (and so the event API) slower here for the rest of the run."""
    out = subprocess.run([sys.executable, __file__, "--build", data_dir, "--docs", str(docs), "--value-size",
                          str(value_size), "--vbuckets", str(vbuckets)], capture_output=True, text=True, check=True)
    return {int(vb): s for vb, s in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def connstr(port: int, buffer: int) -> str:
    return f"couchbase://127.0.0.1:{port}/default?buffer_size={buffer}"


async def read_batches(port: int, highs: dict[int, int], buffer: int,
                       stream_ids: bool = False) -> tuple[float, int, int]:
    from dcpflow.client import batches  # noqa: F401  (pyarrow's import is not part of the rate)
    async with await DcpClient.connect(connstr(port, buffer), USER, PASSWORD, stream_ids=stream_ids) as c:
        t0 = time.perf_counter()
        reader = c.batches({vb: Offset() for vb in highs}, highs, max_rows=65536)
        rows = 0
        async for batch in reader:
            rows += batch.num_rows
        secs = time.perf_counter() - t0
        return secs, rows, reader.stats.get("stream_bytes", 0)  # not kept for a shared connection


async def read_events(port: int, highs: dict[int, int], buffer: int, mitigate: bool = False) -> tuple[float, int]:
    async with await DcpClient.connect(connstr(port, buffer), USER, PASSWORD, mitigate_rollbacks=mitigate) as c:
        t0 = time.perf_counter()
        n = 0
        async for ev in c.events(end=highs):
            if type(ev) is Mutation:
                n += 1
        return time.perf_counter() - t0, n


class LineCounter:
    """A stdout stand-in (text with a binary `buffer`) that keeps what is written to it and counts
    its lines afterwards (`lines`), outside the timed run: counting 38 MB of lines as they come
    cost the timed run about 0.08 s of this process's time, more than /dev/null costs `tail`."""

    def __init__(self):
        self.buffer = self
        self.chunks: list = []

    def write(self, data) -> None:
        self.chunks.append(data)

    def flush(self) -> None:
        pass

    @property
    def lines(self) -> int:
        return sum((c if isinstance(c, bytes | str) else bytes(c)).count("\n" if isinstance(c, str) else b"\n")
                   for c in self.chunks)


def run_tail(port: int, buffer: int) -> tuple[float, int]:
    """`tail --until now` in this process: (seconds, JSON lines)."""
    from dcpflow.client.tail import tail
    out = LineCounter()
    with open(os.devnull, "w") as err:
        t0 = time.perf_counter()
        code = asyncio.run(tail(connstr(port, buffer), username=USER, password=PASSWORD, start="beginning",
                                state_path=None, vbuckets=None, fmt="jsonl", until="now", progress=False,
                                save_interval=5.0, out=out, err=err))
        secs = time.perf_counter() - t0
    assert code == 0
    return secs, out.lines


async def latency(port: int, rate: float, seconds: float, poll: float) -> dict[str, list[float]]:
    """Documents written at a steady `rate` for `seconds`, each carrying the time it was written;
    a plain reader and one with rollback mitigation (polling every `poll` s), both from "now",
    note when each arrives: {"plain": [seconds], "mitigated": [seconds]} from write to delivery."""
    from dcpflow.client.groups import BucketDocs
    got: dict[str, list[float]] = {"plain": [], "mitigated": []}
    total = int(rate * seconds)
    async with await DcpClient.connect(connstr(port, 20 << 20), USER, PASSWORD) as plain, \
            await DcpClient.connect(connstr(port, 20 << 20), USER, PASSWORD, mitigate_rollbacks=True,
                                    persistence_poll_interval=poll) as safe:
        streams = {"plain": plain.events(start="now"), "mitigated": safe.events(start="now")}

        async def read(name):
            async for ev in streams[name]:
                if type(ev) is Mutation and ev.key.startswith(b"lat"):
                    got[name].append(time.perf_counter() - json.loads(ev.value)["t"])
                    if len(got[name]) == total:
                        return
        readers = [asyncio.ensure_future(read(n)) for n in streams]
        await asyncio.sleep(0.5)  # both streams open
        docs = BucketDocs(plain)
        writing = True

        async def behind():  # how far the server's persistence trails its writes, sampled
            while writing:
                highs, persisted = await asyncio.gather(plain.high_seqnos(), plain.persisted_seqnos())
                got["behind"].append(sum(highs.values()) - sum(persisted.values()))
                await asyncio.sleep(0.05)
        got["behind"] = []
        sampler = asyncio.ensure_future(behind())
        t0 = time.perf_counter()
        for i in range(total):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            await docs.store(b"lat%d" % i, {"t": time.perf_counter()})
        writing = False
        await sampler
        await asyncio.wait_for(asyncio.gather(*readers), 60)
        for st in streams.values():
            await st.aclose()
    return got


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def run_group(port: int, buffer: int, members: int, name: str) -> float:
    """`members` processes of a static group (`dcpflow tail --group NAME --member I --of N --until
    now > /dev/null`) draining the bucket together: seconds until the last one exits."""
    env = child_env()
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "dcpflow.cli", "tail", connstr(port, buffer), "--group", name,
                               "--member", str(i), "--of", str(members), "--until", "now", "--from", "beginning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env) for i in range(members)]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err
    return time.perf_counter() - t0


def run_tail_process(port: int, buffer: int) -> float:
    """`dcpflow tail --until now > /dev/null` in a subprocess: seconds."""
    env = child_env()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dcpflow.cli", "tail", connstr(port, buffer), "--until", "now",
                    "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True, env=env)
    return time.perf_counter() - t0


def read_raw(port: int, highs: dict[int, int], buffer: int, expect: int) -> tuple[float, int, list[bytes]]:
    """The same DCP session as the client's, then read `expect` bytes without looking at them."""
    from dcpflow.client.sasl import ScramClient  # SCRAM: PLAIN is only offered inside TLS
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    d = FrameDecoder()
    features = b"".join(int(f).to_bytes(2, "big") for f in (Feature.TCP_NODELAY, Feature.XERROR, Feature.COLLECTIONS))
    call(sock, d, request(Opcode.HELLO, key=b"bench/raw", value=features))
    scram = ScramClient("SCRAM-SHA512", USER, PASSWORD)
    reply = call(sock, d, request(Opcode.SASL_AUTH, key=b"SCRAM-SHA512", value=scram.first()))
    reply = call(sock, d, request(Opcode.SASL_STEP, key=b"SCRAM-SHA512", value=scram.final(reply.value)))
    assert reply.status == Status.SUCCESS
    assert call(sock, d, request(Opcode.SELECT_BUCKET, key=b"default")).status == Status.SUCCESS
    flags = OpenFlag.PRODUCER | OpenFlag.INCLUDE_DELETE_TIMES
    assert call(sock, d, dcp.DcpOpen(b"bench-raw", flags).encode()).status == Status.SUCCESS
    for k, v in ((b"connection_buffer_size", str(buffer).encode()), (b"enable_noop", b"true"),
                 (b"set_noop_interval", b"20"), (b"enable_expiry_opcode", b"true")):
        assert call(sock, d, dcp.DcpControl(k, v).encode()).status == Status.SUCCESS
    ack_every = max(1, buffer // 5)
    reqs = b"".join(dcp.DcpStreamRequest(vb, 0, high, 0, 0, 0, int(StreamFlag.ACTIVE_VB_ONLY), opaque=vb + 1).encode()
                    for vb, high in highs.items())
    record: list[bytes] = []
    total = unacked = 0
    t0 = time.perf_counter()
    sock.sendall(reqs)
    recv = sock.recv
    while total < expect:
        chunk = recv(4 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        record.append(chunk)
        total += len(chunk)
        unacked += len(chunk)
        if unacked >= ack_every:
            sock.sendall(dcp.DcpBufferAck(unacked).encode())
            unacked = 0
    secs = time.perf_counter() - t0
    sock.close()
    return secs, total, record


def deliver(conn, chunk: bytes) -> None:
    """What the event loop's transport does with received bytes: ask the connection (a buffered
    protocol) for its buffer, read into it, report how much arrived."""
    view, pos = memoryview(chunk), 0
    while pos < len(chunk):
        buf = conn.get_buffer(-1)
        n = min(len(buf), len(chunk) - pos)
        buf[:n] = view[pos:pos + n]
        conn.buffer_updated(n)
        pos += n


def decode_only(record: list[bytes], highs: dict[int, int]) -> tuple[float, int]:
    """The client's connection walker + Arrow decoder over recorded bytes, in-process."""
    from dcpflow.client.batches import BatchBuilder
    from dcpflow.client.connection import Connection
    from dcpflow.client.streams import Feed, FeedOptions

    async def run():
        feed = Feed(types.SimpleNamespace(agent="bench", shared=None), {vb: Offset() for vb in highs}, {},
                    FeedOptions())
        builder = BatchBuilder(feed)
        conn = Connection(("bench", 0))
        conn.collections = True
        segs: list = []
        conn.sink = segs.append
        rows = 0
        t0 = time.perf_counter()
        pending, frames = [], 0
        for chunk in record:
            deliver(conn, chunk)
            for seg in segs:
                pending.append(seg)
                frames += len(seg.starts)
            segs.clear()
            if frames >= 65536:
                batch = builder.decode(pending, [], [])
                rows += batch.num_rows if batch is not None else 0
                pending, frames = [], 0
        if pending:
            batch = builder.decode(pending, [], [])
            rows += batch.num_rows if batch is not None else 0
        return time.perf_counter() - t0, rows
    return asyncio.run(run())


# -- RSS child -------------------------------------------------------------------------------------

def rss_mb(field: str = "VmRSS") -> float:
    """RSS (or its peak, VmHWM) of this process in MB. VmHWM rather than ru_maxrss: the latter
    keeps the parent's peak across fork + exec."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_child(port: int, mode: str, buffer: int) -> None:
    if mode == "batches":
        from dcpflow.client import batches  # noqa: F401  (pyarrow + numpy: most of the baseline)
    baseline = rss_mb()
    samples: list[tuple[float, float]] = []
    stop_flag = threading.Event()
    t0 = time.perf_counter()

    def sample():
        while not stop_flag.wait(0.25):
            samples.append((time.perf_counter() - t0, rss_mb()))
    threading.Thread(target=sample, daemon=True).start()

    async def go():
        async with await DcpClient.connect(connstr(port, buffer), USER, PASSWORD) as c:
            highs = await c.high_seqnos()
            n = 0
            if mode == "batches":
                async for batch in c.batches({vb: Offset() for vb in highs}, highs):
                    n += batch.num_rows
            else:
                async for ev in c.events(end=highs):
                    n += type(ev) is Mutation
            return n
    n = asyncio.run(go())
    secs = time.perf_counter() - t0
    stop_flag.set()
    peak = rss_mb("VmHWM")
    tail = [r for t, r in samples if t > secs / 2]
    print(json.dumps({"mode": mode, "items": n, "secs": secs, "peak_mb": peak, "baseline_mb": baseline,
                      "rss_first_half_max": max((r for t, r in samples if t <= secs / 2), default=0),
                      "rss_second_half_max": max(tail, default=0), "samples": len(samples)}))


def rss_phase(port: int, mode: str, buffer: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--rss-child", str(port), "--mode", mode, "--buffer",
                          str(buffer)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--value-size", type=int, default=60)
    p.add_argument("--vbuckets", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="rounds of the three reads; the best of each counts")
    p.add_argument("--buffer", type=int, default=20 * 1024 * 1024, help="flow-control buffer (bytes)")
    p.add_argument("--rss-docs", type=int, default=2_000_000, help="documents for the RSS phase (0 = skip)")
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run that checks the bench works: 2,000 docs, 8 vbuckets, one round")
    p.add_argument("--rate", type=float, default=2000.0, help="writes/s of the latency phase")
    p.add_argument("--latency-seconds", type=float, default=10.0, help="length of the latency phase")
    p.add_argument("--poll", type=float, default=0.1, help="mitigation's persistence poll interval (latency phase)")
    p.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--build", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="batches", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rss_child:
        rss_child(args.rss_child, args.mode, args.buffer)
        return 0
    if args.smoke:
        args.docs, args.vbuckets, args.repeat, args.rss_docs = 2_000, 8, 1, 2_000
        args.rate, args.latency_seconds = 200.0, 1.0
    if args.build:
        value = b'{"v":"' + b"x" * max(0, args.value_size - 8) + b'"}'
        print(json.dumps(build_data_here(args.build, args.docs, value, args.vbuckets, datatype=1)))
        return 0

    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        t = time.perf_counter()
        highs = build_data(os.path.join(tmp, "data"), args.docs, args.value_size, args.vbuckets)
        print(f"built {args.docs:,} docs ({args.value_size}-byte values, {args.vbuckets} vbuckets) in "
              f"{time.perf_counter() - t:.1f}s", flush=True)
        proc, port = start_server(os.path.join(tmp, "data"), args.vbuckets)
        b_secs = e_secs = r_secs = t_secs = p_secs = s_secs = m_secs = float("inf")
        g_secs: dict[int, float] = {}
        cpu = {"batch": float("inf"), "event": float("inf"), "raw": float("inf"), "sid": float("inf")}
        try:
            for _ in range(args.repeat):  # interleaved, best of each: the server's caches warm up alike
                c0 = time.process_time()
                secs, rows, stream_bytes = asyncio.run(read_batches(port, highs, args.buffer))
                c1 = time.process_time()
                b_secs, cpu["batch"] = min(b_secs, secs), min(cpu["batch"], c1 - c0)
                c1 = time.process_time()
                secs, s_rows, _ = asyncio.run(read_batches(port, highs, args.buffer, stream_ids=True))
                s_secs = min(s_secs, secs)
                cpu["sid"] = min(cpu["sid"], time.process_time() - c1)
                c1 = time.process_time()
                secs, events = asyncio.run(read_events(port, highs, args.buffer))
                c2 = time.process_time()
                e_secs, cpu["event"] = min(e_secs, secs), min(cpu["event"], c2 - c1)
                secs, m_events = asyncio.run(read_events(port, highs, args.buffer, mitigate=True))
                m_secs = min(m_secs, secs)
                assert m_events == events, (m_events, events)
                secs, r_bytes, record = read_raw(port, highs, args.buffer, stream_bytes)
                r_secs, cpu["raw"] = min(r_secs, secs), min(cpu["raw"], time.process_time() - c2)
                secs, tail_lines = run_tail(port, args.buffer)
                t_secs = min(t_secs, secs)
                p_secs = min(p_secs, run_tail_process(port, args.buffer))
            # These write to the bucket (latency documents, the groups' offsets): after the reads above.
            for rnd in range(args.repeat):
                for n in (1, 2, 3):
                    g_secs[n] = min(g_secs.get(n, float("inf")), run_group(port, args.buffer, n, f"bench{rnd}x{n}"))
            lat = asyncio.run(latency(port, args.rate, args.latency_seconds, args.poll))
        finally:
            stop(proc)
        d_secs, d_rows = decode_only(record, highs)
        assert rows == events == args.docs == d_rows == tail_lines == s_rows, (rows, events, d_rows, tail_lines, s_rows)
        limit = args.docs / r_secs
        print(f"stream bytes {stream_bytes / 1e6:.1f} MB, {args.docs:,} mutations, buffer {args.buffer:,} bytes, "
              f"best of {args.repeat}")
        us = {k: v / args.docs * 1e6 for k, v in cpu.items()}
        print(f"{'raw socket (limit)':<22} {limit:>12,.0f} items/s  {r_bytes / r_secs / 1e6:8.1f} MB/s   1.00x"
              f"          client CPU {us['raw']:.2f} us/item")
        for name, secs, key in (("batch API (Arrow)", b_secs, "batch"), ("event API", e_secs, "event")):
            rate = args.docs / secs
            print(f"{name:<22} {rate:>12,.0f} items/s  {stream_bytes / secs / 1e6:8.1f} MB/s   "
                  f"{rate / limit:.2f}x of limit  client CPU {us[key]:.2f} us/item")
        print(f"{'batch API, stream-ids':<22} {args.docs / s_secs:>12,.0f} items/s  "
              f"{stream_bytes / s_secs / 1e6:8.1f} MB/s   {b_secs / s_secs:.2f}x the batch API's rate, client CPU "
              f"{us['sid']:.2f} us/item")
        print(f"{'tail (JSON lines)':<22} {args.docs / t_secs:>12,.0f} items/s  {t_secs:8.2f} s      "
              f"{t_secs / b_secs:.2f}x the batch API's drain time ({b_secs:.2f} s)")
        print(f"{'dcpflow tail (process)':<22} {args.docs / p_secs:>12,.0f} items/s  {p_secs:8.2f} s      "
              f"{p_secs / b_secs:.2f}x, with Python's start-up and imports")
        print(f"{'decode only (no I/O)':<22} {args.docs / d_secs:>12,.0f} items/s  "
              f"{r_bytes / d_secs / 1e6:8.1f} MB/s   client CPU alone; {args.docs / d_secs / limit:.2f}x of limit")
        print(f"batch API / event API: {e_secs / b_secs:.2f}x in items/s, {us['event'] / us['batch']:.2f}x in client "
              f"CPU per item")
        print(f"{'events, mitigated':<22} {args.docs / m_secs:>12,.0f} items/s  {m_secs:8.2f} s      "
              f"mitigation on / off: {e_secs / m_secs:.2f}x the event API's rate (everything already persisted)")
        behind = lat.pop("behind")
        p50 = {k: pct(v, 0.5) * 1e3 for k, v in lat.items()}
        p99 = {k: pct(v, 0.99) * 1e3 for k, v in lat.items()}
        print(f"delivery latency at {args.rate:g} writes/s for {args.latency_seconds:g}s (poll {args.poll:g}s): plain "
              f"p50 {p50['plain']:.1f} ms p99 {p99['plain']:.1f} ms; mitigated p50 {p50['mitigated']:.1f} ms p99 "
              f"{p99['mitigated']:.1f} ms; mitigation adds p50 {p50['mitigated'] - p50['plain']:.1f} ms, "
              f"p99 {p99['mitigated'] - p99['plain']:.1f} ms")
        if behind:
            print(f"the server's persistence meanwhile trailed its writes by a median {pct(behind, 0.5):,.0f} seqnos "
                  f"(~{pct(behind, 0.5) / args.rate * 1e3:.0f} ms of writes), p99 {pct(behind, 0.99):,.0f}")
        for n, secs in sorted(g_secs.items()):
            print(f"group of {n} (processes) {args.docs / secs:>10,.0f} items/s  {secs:8.2f} s      "
                  f"{g_secs[1] / secs:.2f}x the rate of a group of 1 (the same event-by-event JSON path); one "
                  f"`dcpflow tail` (batch JSON path) took {p_secs:.2f} s")

    if args.rss_docs:
        with tempfile.TemporaryDirectory(prefix="bench-client-rss-") as tmp:
            t = time.perf_counter()
            build_data(os.path.join(tmp, "data"), args.rss_docs, args.value_size, args.vbuckets)
            print(f"built {args.rss_docs:,} docs for the RSS phase in {time.perf_counter() - t:.1f}s", flush=True)
            proc, port = start_server(os.path.join(tmp, "data"), args.vbuckets)
            try:
                for mode in ("batches", "events"):
                    r = rss_phase(port, mode, args.buffer)
                    print(f"RSS {mode:<8} {r['items']:,} docs in {r['secs']:.1f}s ({r['items'] / r['secs']:,.0f}/s): "
                          f"peak {r['peak_mb']:.0f} MB (after imports {r['baseline_mb']:.0f} MB); max in 1st half "
                          f"{r['rss_first_half_max']:.0f} MB, 2nd half {r['rss_second_half_max']:.0f} MB")
            finally:
                stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
