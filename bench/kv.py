"""KV throughput of `dcpflow server` against memcached, measured in the same run with the same client.

One pipelined binary-protocol client (built on dcpflow.protocol) sends windows of requests (64 by
default) and reads the whole window's replies before sending the next: SET then GET over a key set,
first against a `dcpflow server` subprocess, then against memcached from Debian's package (started
on a free port on 127.0.0.1; `apt-get install -y memcached` if it is missing). Both servers get the
same request bytes (memcached ignores the vbucket field). Prints ops/s for each and the ratio.

The SET figure includes the flusher persisting the SETs (it shares the server's CPU and GIL). Each
GET phase starts once dcpflow has persisted everything (STAT ep_queue_size 0), so it measures GET;
--no-settle starts it at once, beside the flusher still working off the SET phase.

    .venv/bin/python bench/kv.py                # 200k ops per phase, 100-byte values, window 64
    .venv/bin/python bench/kv.py --ops 500000 --value-size 1000
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from dcpflow.protocol.frame import FrameDecoder, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from serverproc import call, next_frame, start_server, stop


class Client:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder()

    def call(self, opcode: int, **kw):
        return call(self.sock, self.decoder, request(opcode, **kw))

    def stats(self) -> dict[bytes, bytes]:
        """STAT with no group: one reply per stat, ended by one with no key."""
        out = {}
        frame = self.call(Opcode.STAT)
        while frame.key:
            out[frame.key] = frame.value
            frame = next_frame(self.sock, self.decoder)
        return out

    def settle(self, timeout: float = 120.0) -> float:
        """Wait until the server has persisted every write (ep_queue_size 0; memcached has no such
        stat and no disk): the GET phase then measures GET, not GET beside the flusher working off
        the SET phase's backlog. Returns the seconds waited."""
        t0 = time.perf_counter()
        while int(self.stats().get(b"ep_queue_size", b"0")) and time.perf_counter() - t0 < timeout:
            time.sleep(0.05)
        return time.perf_counter() - t0

    def login(self, user: str, password: str, bucket: str) -> None:
        self.call(Opcode.HELLO, key=b"bench/kv", value=int(Feature.TCP_NODELAY).to_bytes(2, "big"))
        reply = self.call(Opcode.SASL_AUTH, key=b"PLAIN", value=b"\0" + user.encode() + b"\0" + password.encode())
        assert reply.status == Status.SUCCESS, f"auth failed: {reply.status:#x}"
        assert self.call(Opcode.SELECT_BUCKET, key=bucket.encode()).status == Status.SUCCESS


def windows(opcode: int, keys: list[bytes], value: bytes, window: int, num_vbuckets: int) -> list[tuple[bytes, int]]:
    """Pre-encoded (requests, count) windows, so the client spends its time on I/O and replies."""
    out = []
    for start in range(0, len(keys), window):
        reqs = []
        for i, key in enumerate(keys[start:start + window]):
            vb = vbucket_for_key(key, num_vbuckets)
            if opcode == Opcode.SET:
                reqs.append(request(opcode, key=key, extras=bytes(8), value=value, vbucket=vb, opaque=i))
            else:
                reqs.append(request(opcode, key=key, vbucket=vb, opaque=i))
        out.append((b"".join(reqs), len(reqs)))
    return out


def run_phase(client: Client, wins: list[tuple[bytes, int]], ops: int, depth: int) -> float:
    """ops/s for at least `ops` operations, cycling over the windows, with `depth` windows in flight: the
    next window is sent before the replies of the previous one are read, so client and server work
    at the same time (depth 1: strictly one window, then its replies)."""
    sock, decoder = client.sock, client.decoder
    done = sent = i = 0
    in_flight: list[int] = []
    t0 = time.perf_counter()
    while done < ops:
        while len(in_flight) < depth and sent < ops:
            data, n = wins[i % len(wins)]
            sock.sendall(data)
            in_flight.append(n)
            sent += n
            i += 1
        want = in_flight.pop(0)
        got = 0
        while got < want:
            frame = decoder.next_frame()
            if frame is None:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("server closed the connection")
                decoder.feed(chunk)
                continue
            if frame.status != Status.SUCCESS:
                raise RuntimeError(f"request failed with status 0x{frame.status:x}")
            got += 1
        done += want
    return done / (time.perf_counter() - t0)


def measure(port: int, args, login: bool) -> dict[str, float]:
    client = Client(port)
    if login:
        client.login("Administrator", "password", "default")
    keys = [b"bench-key-%08d" % i for i in range(args.keys)]
    value = os.urandom(args.value_size // 2 + 1).hex()[: args.value_size].encode()
    sets = windows(Opcode.SET, keys, value, args.window, args.vbuckets)
    gets = windows(Opcode.GET, keys, value, args.window, args.vbuckets)
    run_phase(client, sets, len(keys), 1)  # warm-up: every key exists
    result = {"set": 0.0, "get": 0.0, "settle": 0.0}
    for _ in range(args.repeat):  # best of N: this machine's neighbours are noisy
        result["set"] = max(result["set"], run_phase(client, sets, args.ops, args.depth))
        if not args.no_settle:
            result["settle"] = max(result["settle"], client.settle())
        result["get"] = max(result["get"], run_phase(client, gets, args.ops, args.depth))
    client.sock.close()
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dcpflow(data_dir: str, args) -> tuple[subprocess.Popen, int]:
    return start_server(data_dir, args.vbuckets, "--allow-plain-over-tcp", *args.server_arg)


def start_memcached() -> tuple[subprocess.Popen, int]:
    binary = shutil.which("memcached") or "/usr/bin/memcached"
    if not os.path.exists(binary):
        raise RuntimeError("memcached is not installed: apt-get install -y memcached")
    port = free_port()
    cmd = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "1024", "-t", "4"]
    if os.geteuid() == 0:
        cmd += ["-u", "root"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"memcached exited: {proc.stderr.read().decode()}") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("memcached did not start listening")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=200_000, help="operations per phase (default 200000)")
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys (default 10000)")
    p.add_argument("--value-size", type=int, default=100, help="value bytes (default 100)")
    p.add_argument("--window", type=int, default=64, help="requests in flight per round trip (default 64)")
    p.add_argument("--repeat", type=int, default=3, help="rounds per phase; the best counts (default 3)")
    p.add_argument("--depth", type=int, default=2,
                   help="windows in flight (default 2: send the next window before reading the previous replies)")
    p.add_argument("--vbuckets", type=int, default=1024, help="vbuckets of the dcpflow bucket (default 1024)")
    p.add_argument("--no-memcached", action="store_true", help="measure dcpflow only")
    p.add_argument("--no-settle", action="store_true",
                   help="start each GET phase at once, while the flusher may still be persisting the SET phase")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `dcpflow server` (repeatable), e.g. --server-arg=--flush-interval=1")
    args = p.parse_args()

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        proc, port = start_dcpflow(tmp, args)
        try:
            results["dcpflow"] = measure(port, args, login=True)
        finally:
            stop(proc)
    if not args.no_memcached:
        proc, port = start_memcached()
        try:
            results["memcached"] = measure(port, args, login=False)
        finally:
            stop(proc)

    print(f"KV throughput, one pipelined client, window {args.window} x depth {args.depth}, "
          f"{args.value_size}-byte values, "
          f"{args.keys} keys, best of {args.repeat} x {args.ops} ops per phase")
    for name, r in results.items():
        print(f"  {name:10s} SET {r['set']:>10,.0f} ops/s   GET {r['get']:>10,.0f} ops/s")
    if not args.no_settle and "dcpflow" in results:
        print(f"  (each GET phase started once dcpflow had persisted the SET phase: up to "
              f"{results['dcpflow']['settle']:.1f} s; --no-settle measures GET beside the flusher)")
    if "memcached" in results:
        d, m = results["dcpflow"], results["memcached"]
        print(f"  ratio dcpflow/memcached: SET {d['set'] / m['set']:.2f}x   GET {d['get'] / m['get']:.2f}x "
              f"(target >= 0.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
