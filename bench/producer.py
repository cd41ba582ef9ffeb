"""DCP producer throughput of `dcpflow server` against the loopback limit, measured in the same run.

A data dir with N documents spread over the bucket's vbuckets is built with the engine (and
flushed), then `dcpflow server` (a subprocess) serves it:

* backfill - one DCP connection streams every vbucket from seqno 0 to its high seqno: everything
  comes from the on-disk store (Disk snapshots);
* in-memory - a second connection opens streams at the high seqnos (FromLatest), flow control holds
  them while N new documents are written over KV, then (once SEQNO_PERSISTENCE says the flusher
  has them on disk, unless --no-wait-persist) they drain from the checkpoints (Memory snapshots)
  up to the end seqnos;
* limit - the exact bytes each phase received are sent again by a plain socket server (another
  subprocess, `sendall` of 1 MiB slices) to the same consumer code.

The consumer drains with minimal work, the same in a phase and in its limit: it receives into
memory allocated before the clock starts (`recv_into`: keeping the bytes for the limit costs
nothing), walks the 24-byte headers to count items and STREAM_ENDs and sends a BUFFER_ACK
whenever a fifth of the flow-control buffer has arrived. Prints items/s,
MB/s and the ratio producer/limit for each phase (target >= 0.5x).

    .venv/bin/python bench/producer.py                      # 1M docs, 100-byte values, 64 vbuckets
    .venv/bin/python bench/producer.py --vbuckets 1024 --connections 2   # + a backfill split over 2 connections
    .venv/bin/python bench/producer.py --docs 200000 --value-size 1000
    .venv/bin/python bench/producer.py --smoke                  # seconds: 2,000 docs, 8 vbuckets, one round
"""

import argparse
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import OpenFlag, StreamFlag
from dcpflow.protocol.frame import FrameDecoder, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.kv import SeqnoPersistence
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from serverproc import build_data, call, cpu_seconds, start_server, stop

_BLEN = struct.Struct(">I").unpack_from
MAX = 0xFFFFFFFFFFFFFFFF


SERVER_PID: list[int] = []
CPU: dict[str, float] = {}  # phase -> server CPU microseconds per item (best round)
CONSUMER: dict[str, float] = {}  # phase (or "limit <phase>") -> this process's CPU us per item (best round)
FLUSH_WAIT: list[float] = []  # seconds the in-memory rounds waited for the flusher before draining


def keep_best(table: dict[str, float], name: str, us_per_item: float) -> None:
    """The lowest CPU per item a phase's rounds measured."""
    table[name] = min(table.get(name, us_per_item), us_per_item)


def server_cpu() -> float:
    """CPU seconds the server process has used (0 before it started)."""
    return cpu_seconds(SERVER_PID[0]) if SERVER_PID else 0.0


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def login(sock: socket.socket) -> FrameDecoder:
    d = FrameDecoder()
    call(sock, d, request(Opcode.HELLO, key=b"bench/producer", value=int(Feature.TCP_NODELAY).to_bytes(2, "big")))
    reply = call(sock, d, request(Opcode.SASL_AUTH, key=b"PLAIN", value=b"\0Administrator\0password"))
    assert reply.status == Status.SUCCESS, reply
    assert call(sock, d, request(Opcode.SELECT_BUCKET, key=b"default")).status == Status.SUCCESS
    return d


def open_producer(port: int, name: str, buffer_size: int) -> socket.socket:
    sock = connect(port)
    d = login(sock)
    assert call(sock, d, dcp.DcpOpen(name.encode(), OpenFlag.PRODUCER).encode()).status == Status.SUCCESS
    reply = call(sock, d, dcp.DcpControl(b"connection_buffer_size", str(buffer_size).encode()).encode())
    assert reply.status == Status.SUCCESS
    assert not d.buffered
    return sock


def reserve(nbytes: int) -> bytearray:
    """Memory for a drain, made before the clock starts: zero-filled, so its pages are touched now
    and the drain only copies into them (the same cost in a phase and in its limit)."""
    return bytearray(nbytes + (4 << 20))


def expected_bytes(docs: int, value_size: int, streams: int) -> int:
    """About what a phase receives: a mutation per document (header, extras, a ~14-byte key, the
    value) and each stream's marker and end."""
    return docs * (24 + 31 + 16 + value_size) + streams * 256


def drain(sock: socket.socket, buf: bytearray, *, streams: int, buffer_size: int) -> tuple[int, int, list]:
    """Read until `streams` STREAM_ENDs, straight into `buf` (recv_into: nothing allocated per read,
    nothing copied to keep the bytes); ack a fifth of the buffer at a time. Returns (items, bytes,
    the bytes as memoryviews). Should `buf` fill, another one is allocated while timing - a
    message cut at its end moves there - so size it with `expected_bytes`."""
    view = memoryview(buf)
    segments: list = []
    filled = pos = items = ends = unacked = 0
    ack_every = max(1, buffer_size // 5)
    recv_into, blen = sock.recv_into, _BLEN
    while ends < streams:
        if filled == len(buf):
            keep = filled - pos
            segments.append(view[:pos])
            buf = bytearray(max(len(buf), keep + (8 << 20)))
            buf[:keep] = view[pos:filled]
            view, filled, pos = memoryview(buf), keep, 0
        got = recv_into(view[filled:filled + (4 << 20)])
        if not got:
            raise ConnectionError("producer closed the connection")
        filled += got
        start = pos
        while filled - pos >= 24:
            end = pos + 24 + blen(buf, pos + 8)[0]
            if end > filled:
                break
            op = buf[pos + 1]
            if op == 0x57 or op == 0x58 or op == 0x59:
                items += 1
            elif op == 0x55:
                ends += 1
            pos = end
        if buffer_size:
            unacked += pos - start
            if unacked >= ack_every:
                sock.sendall(dcp.DcpBufferAck(unacked).encode())
                unacked = 0
    segments.append(view[:filled])
    return items, sum(len(seg) for seg in segments), segments


def backfill_phase(port: int, highs: dict[int, int], buffer_size: int, value_size: int,
                   round_no: int = 0) -> tuple[float, int, int, list]:
    sock = open_producer(port, f"bench-backfill-{round_no}", buffer_size)
    buf = reserve(expected_bytes(sum(highs.values()), value_size, len(highs)))
    cpu0, own0 = server_cpu(), time.process_time()
    t0 = time.perf_counter()
    sock.sendall(b"".join(dcp.DcpStreamRequest(vb, 0, high, opaque=vb + 1).encode() for vb, high in highs.items()))
    items, nbytes, record = drain(sock, buf, streams=len(highs), buffer_size=buffer_size)
    elapsed = time.perf_counter() - t0
    keep_best(CPU, "backfill", (server_cpu() - cpu0) / items * 1e6)
    keep_best(CONSUMER, "backfill", (time.process_time() - own0) / items * 1e6)
    sock.close()
    return elapsed, items, nbytes, record


def concurrent_backfill(port: int, highs: dict[int, int], buffer_size: int, value_size: int, connections: int) -> str:
    """The backfill again, its vbuckets split among `connections` DCP connections drained at once
    (one thread each: the consumers share this process's GIL, so watch the server CPU per item)."""
    shares = [dict(list(highs.items())[i::connections]) for i in range(connections)]
    results: list = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        backfill_phase(port, shares[i], buffer_size, value_size, 1000 + i)[:3])) for i in range(connections)]
    cpu0 = server_cpu()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    items, nbytes = sum(r[1] for r in results), sum(r[2] for r in results)
    return (f"  backfill over {connections} connections at once: {items / elapsed:,.0f} items/s "
            f"{nbytes / elapsed / 1e6:.1f} MB/s   server CPU {(server_cpu() - cpu0) / items * 1e6:.2f} us/item")


def memory_phase(port: int, highs: dict[int, int], docs: int, value: bytes, vbuckets: int,
                 buffer_size: int, round_no: int = 0,
                 wait_persisted: bool = True) -> tuple[float, int, int, list, int]:
    keys = [b"new%d-%09d" % (round_no, i) for i in range(docs)]
    per_vb: dict[int, int] = dict.fromkeys(highs, 0)
    for k in keys:
        per_vb[vbucket_for_key(k, vbuckets)] += 1
    sock = open_producer(port, f"bench-memory-{round_no}", buffer_size)
    reqs = [dcp.DcpStreamRequest(vb, highs[vb], highs[vb] + n, 0, highs[vb], highs[vb], StreamFlag.FROM_LATEST,
                                 opaque=vb + 1).encode() for vb, n in per_vb.items() if n]
    for vb, n in per_vb.items():
        highs[vb] += n  # the next round starts after these
    sock.sendall(b"".join(reqs))
    # write the documents while the streams are held by flow control (nothing is acked yet)
    w = connect(port)
    d = login(w)
    window = 256
    for i in range(0, docs, window):
        batch = keys[i:i + window]
        w.sendall(b"".join(request(Opcode.SET_Q, key=k, extras=bytes(8), value=value,
                                   vbucket=vbucket_for_key(k, vbuckets), opaque=j) for j, k in enumerate(batch)))
    assert call(w, d, request(Opcode.NOOP)).status == Status.SUCCESS  # every quiet SET is done
    if wait_persisted:
        # The flusher writes the same N documents to disk in the background; wait for it, so the
        # drain measures the producer and not the producer sharing the GIL with the flusher.
        t = time.perf_counter()
        for vb in per_vb:
            assert call(w, d, SeqnoPersistence(vb, highs[vb]).encode()).status == Status.SUCCESS
        FLUSH_WAIT.append(time.perf_counter() - t)
    w.close()
    buf = reserve(expected_bytes(docs, len(value), len(reqs)))
    cpu0, own0 = server_cpu(), time.process_time()
    t0 = time.perf_counter()
    items, nbytes, record = drain(sock, buf, streams=len(reqs), buffer_size=buffer_size)
    elapsed = time.perf_counter() - t0
    keep_best(CPU, "in-memory", (server_cpu() - cpu0) / items * 1e6)
    keep_best(CONSUMER, "in-memory", (time.process_time() - own0) / items * 1e6)
    sock.close()
    return elapsed, items, nbytes, record, len(reqs)


SENDER = r"""
import socket, sys
data = open(sys.argv[1], "rb").read()
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
view = memoryview(data)
for i in range(0, len(data), 1 << 20):
    conn.sendall(view[i:i + (1 << 20)])
conn.shutdown(socket.SHUT_WR)
while conn.recv(1 << 20):
    pass
"""


PINGER = r"""
import socket, struct, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
noop = struct.pack(">BBHBBHIIQ", 0x80, 0x0a, 0, 0, 0, 0, 0, 0, 0)
lat = []
end = time.perf_counter() + seconds
while time.perf_counter() < end:
    t = time.perf_counter(); s.sendall(noop); got = b""
    while len(got) < 24:
        got += s.recv(24 - len(got))
    lat.append(time.perf_counter() - t); time.sleep(0.002)
lat.sort()
print(f"{len(lat)} {lat[len(lat) // 2] * 1e3:.2f} {lat[int(len(lat) * 0.99)] * 1e3:.2f} {lat[-1] * 1e3:.2f}")
"""


def start_pinger(port: int, seconds: float) -> subprocess.Popen:
    """Another client's NOOP round trips while a phase runs: how long the event loop is blocked."""
    return subprocess.Popen([sys.executable, "-c", PINGER, str(port), str(seconds)], stdout=subprocess.PIPE, text=True)


def limit_phase(record: list, streams: int, buffer_size: int, tmp: str, name: str) -> tuple[float, int, int]:
    path = os.path.join(tmp, "stream.bin")
    with open(path, "wb") as f:
        f.writelines(record)
    proc = subprocess.Popen([sys.executable, "-c", SENDER, path], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    sock = connect(port)
    buf = reserve(sum(len(seg) for seg in record))
    own0 = time.process_time()
    t0 = time.perf_counter()
    items, nbytes, _ = drain(sock, buf, streams=streams, buffer_size=buffer_size)
    elapsed = time.perf_counter() - t0
    keep_best(CONSUMER, f"limit {name}", (time.process_time() - own0) / items * 1e6)
    sock.close()
    proc.wait(60)
    return elapsed, items, nbytes


def best(rounds):
    """The fastest round (first field: seconds), keeping only its bytes in memory as they come."""
    fastest = None
    for measured in rounds:
        if fastest is None or measured[0] < fastest[0]:
            fastest = measured
    return fastest


def report(name: str, measured: tuple[float, int, int], limit: tuple[float, int, int]) -> None:
    t, items, nbytes = measured
    lt, litems, lbytes = limit
    assert (items, nbytes) == (litems, lbytes), (items, nbytes, litems, lbytes)
    print(f"  {name:9s} producer {items / t:>11,.0f} items/s {nbytes / t / 1e6:8.1f} MB/s   "
          f"loopback limit {litems / lt:>11,.0f} items/s {lbytes / lt / 1e6:8.1f} MB/s   ratio {lt / t:.2f}x   "
          f"server CPU {CPU.get(name, 0):.2f} us/item   consumer CPU {CONSUMER.get(name, 0):.2f} "
          f"(limit {CONSUMER.get('limit ' + name, 0):.2f}) us/item")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=1_000_000, help="documents per phase (default 1000000)")
    p.add_argument("--value-size", type=int, default=100, help="value bytes (default 100)")
    p.add_argument("--vbuckets", type=int, default=64, help="vbuckets (default 64)")
    p.add_argument("--buffer", type=int, default=10 * 1024 * 1024,
                   help="connection_buffer_size (default 10 MiB; 0 disables flow control)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of each phase and limit; the best counts (default 3)")
    p.add_argument("--connections", type=int, default=1,
                   help="also backfill over this many connections at once (default 1: no extra phase)")
    p.add_argument("--no-wait-persist", action="store_true",
                   help="drain the in-memory phase while the flusher still persists its writes (the two share the "
                        "server's GIL; by default the drain starts once SEQNO_PERSISTENCE says they are on disk)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `dcpflow server` (repeatable)")
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run that checks the bench works: 2,000 docs, 8 vbuckets, one round")
    args = p.parse_args()
    ping_seconds = 3.0  # another client's NOOPs during the first seconds of the backfill
    if args.smoke:
        args.docs, args.vbuckets, args.repeat, ping_seconds = 2_000, 8, 1, 0.5
    value = (b"x" * args.value_size)
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        t = time.perf_counter()
        highs = build_data(tmp, args.docs, value, args.vbuckets)
        print(f"built {args.docs:,} documents in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        proc, port = start_server(tmp, args.vbuckets, "--flush-interval", "0.1", "--allow-plain-over-tcp",
                                  *args.server_arg)
        SERVER_PID[:] = [proc.pid]
        try:
            pinger = start_pinger(port, ping_seconds)
            time.sleep(0.2)
            backfill = best(backfill_phase(port, dict(highs), args.buffer, args.value_size, r)
                            for r in range(args.repeat))
            ping = pinger.communicate(timeout=120)[0].split()
            split = (concurrent_backfill(port, dict(highs), args.buffer, args.value_size, args.connections)
                      if args.connections > 1 else None)
            memory = best(memory_phase(port, highs, args.docs, value, args.vbuckets, args.buffer, r,
                                       not args.no_wait_persist) for r in range(args.repeat))
        finally:
            stop(proc)
        back_limit = best(limit_phase(backfill[3], len(highs), args.buffer, tmp, "backfill")
                          for _ in range(args.repeat))
        mem_limit = best(limit_phase(memory[3], memory[4], args.buffer, tmp, "in-memory")
                         for _ in range(args.repeat))
    print(f"DCP producer, {args.docs:,} mutations per phase, {args.value_size}-byte values, {args.vbuckets} vbuckets, "
          f"connection_buffer_size {args.buffer:,}, best of {args.repeat}")
    report("backfill", backfill[:3], back_limit)
    report("in-memory", memory[:3], mem_limit)
    if split:
        print(split)
    if FLUSH_WAIT:
        print(f"  (in-memory: the drain started once the writes were persisted; waited {min(FLUSH_WAIT):.1f}-"
              f"{max(FLUSH_WAIT):.1f} s for the flusher - --no-wait-persist drains while it runs)")
    if len(ping) == 4:
        print(f"  another client's NOOP round trip during the backfill (first {ping_seconds:g} s): "
              f"median {ping[1]} ms, p99 {ping[2]} ms, max {ping[3]} ms over {ping[0]} requests")
    print("  (ratio = loopback time / producer time for the same bytes; target >= 0.5x. server CPU: CPU time the "
          "server process used per item in that phase - below the wall time per item when the machine is busy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
