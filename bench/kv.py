"""KV throughput of `dcpflow server` against memcached, measured in the same run with the same client.

One pipelined binary-protocol client (built on dcpflow.protocol) sends windows of requests (64 by
default) and reads the whole window's replies before sending the next: SET then GET over a key set,
against a `dcpflow server` subprocess and against memcached from Debian's package (started on a
free port on 127.0.0.1; install it with `apt-get install -y memcached`), both running: each round
runs the SET phase on one then the other, then the GET phases, so the machine's slow spells hit both
sides of the ratio. Both servers get the same request bytes (memcached ignores the vbucket field);
prints the best of the rounds for each and the ratio.

The SET figure includes the flusher persisting the SETs (it shares the server's CPU and GIL). Each
phase starts once dcpflow has persisted everything (STAT ep_queue_size 0), so a GET phase measures
GET and the flusher never runs beside memcached's phases; --no-settle starts each phase at once.

    .venv/bin/python bench/kv.py                # 200k ops per phase, 100-byte values, window 64
    .venv/bin/python bench/kv.py --ops 500000 --value-size 1000
    .venv/bin/python bench/kv.py --smoke        # seconds: 2,000 ops per phase, 200 keys, one round

    .venv/bin/python bench/kv.py --durability majority          # durable vs plain SETs, 3-node cluster
    .venv/bin/python bench/kv.py --durability majority --smoke

--durability LEVEL (majority, majority_and_persist_active, persist_to_majority) measures something
else: durable SETs against plain SETs on the same `dcpflow cluster` of 3 nodes (bench/kv_durable.py).

--subdoc measures the sub-document commands against plain GET/SET on the same dcpflow server in
the same run (memcached has no sub-document commands): the documents are JSON of about
--value-size bytes; `mutate_in` is a SUBDOC_MULTI_MUTATION with one DICT_UPSERT spec and
`lookup_in` a SUBDOC_MULTI_LOOKUP with one GET spec, which is what the official SDKs send for a
single-path mutate_in / lookup_in. Ratios mutate_in/SET and lookup_in/GET (target >= 0.7x).

    .venv/bin/python bench/kv.py --subdoc

--smoke checks that the bench works end to end. Without memcached installed it measures dcpflow
alone and says so (a full run fails instead: its figure is the ratio): the smoke runs in the test
suite, which must not install system packages or depend on the network.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import kv_durable
from dcpflow.protocol.frame import FrameDecoder, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.protocol.subdoc import SubdocSpec
from serverproc import call, next_frame, start_server, stop

#: --subdoc: what each sub-document phase sends (one spec, as an SDK's single-path call does).
SUBDOC_REQUESTS = {
    "mutate_in": (Opcode.SUBDOC_MULTI_MUTATION, SubdocSpec(Opcode.SUBDOC_DICT_UPSERT, b"n", b"42").encode(True)),
    "lookup_in": (Opcode.SUBDOC_MULTI_LOOKUP, SubdocSpec(Opcode.SUBDOC_GET, b"name").encode(False)),
}


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

    @classmethod
    def logged_in(cls, port: int) -> "Client":
        """A Client of bucket `default` as Administrator."""
        client = cls(port)
        client.login("Administrator", "password", "default")
        return client

    def login(self, user: str, password: str, bucket: str) -> None:
        self.call(Opcode.HELLO, key=b"bench/kv", value=int(Feature.TCP_NODELAY).to_bytes(2, "big"))
        reply = self.call(Opcode.SASL_AUTH, key=b"PLAIN", value=b"\0" + user.encode() + b"\0" + password.encode())
        assert reply.status == Status.SUCCESS, f"auth failed: {reply.status:#x}"
        assert self.call(Opcode.SELECT_BUCKET, key=bucket.encode()).status == Status.SUCCESS


def random_value(size: int) -> bytes:
    """`size` random hex digits: a value that is not JSON, new in every run."""
    return os.urandom(size // 2 + 1).hex()[:size].encode()


def json_value(size: int) -> bytes:
    """A JSON object of about `size` bytes with the fields the --subdoc phases name."""
    head = b'{"name":"bench","n":1,"pad":"'
    return head + os.urandom(size).hex()[:max(0, size - len(head) - 2)].encode() + b'"}'


def windows(opcode: int, keys: list[bytes], value: bytes, window: int, num_vbuckets: int) -> list[tuple[bytes, int]]:
    """Pre-encoded (requests, count) windows, so the client spends its time on I/O and replies."""
    out = []
    for start in range(0, len(keys), window):
        reqs = []
        for i, key in enumerate(keys[start:start + window]):
            vb = vbucket_for_key(key, num_vbuckets)
            if opcode == Opcode.SET:
                reqs.append(request(opcode, key=key, extras=bytes(8), value=value, vbucket=vb, opaque=i))
            elif opcode in (Opcode.SUBDOC_MULTI_MUTATION, Opcode.SUBDOC_MULTI_LOOKUP):
                reqs.append(request(opcode, key=key, value=value, vbucket=vb, opaque=i))
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


class Target:
    """One server under test: its client, pre-encoded windows and best figures so far."""

    def __init__(self, port: int, args, login: bool, value: bytes):
        self.client = Client(port)
        if login:
            self.client.login("Administrator", "password", "default")
        keys = [b"bench-key-%08d" % i for i in range(args.keys)]
        self.phases = {"set": windows(Opcode.SET, keys, value, args.window, args.vbuckets),
                       "get": windows(Opcode.GET, keys, value, args.window, args.vbuckets)}
        if args.subdoc:
            for name, (opcode, body) in SUBDOC_REQUESTS.items():
                self.phases[name] = windows(opcode, keys, body, args.window, args.vbuckets)
        run_phase(self.client, self.phases["set"], len(keys), 1)  # warm-up: every key exists
        self.result = {name: 0.0 for name in self.phases} | {"settle": 0.0}


def measure(targets: dict[str, Target], args) -> dict[str, dict[str, float]]:
    """Best of `repeat` rounds; within a round the servers take turns phase by phase, so a slow
    spell of this busy machine hits both sides of the ratio rather than one. Each phase starts
    once dcpflow has persisted what came before (unless --no-settle), so its flusher never runs
    beside the other server's phase either."""
    phases = ("set", "mutate_in", "get", "lookup_in") if args.subdoc else ("set", "get")
    for _ in range(args.repeat):
        for phase in phases:
            for target in targets.values():
                if not args.no_settle:  # dcpflow's flusher must not run beside anyone's next phase
                    for other in targets.values():
                        other.result["settle"] = max(other.result["settle"], other.client.settle())
                rate = run_phase(target.client, target.phases[phase], args.ops, args.depth)
                target.result[phase] = max(target.result[phase], rate)
    for target in targets.values():
        target.client.sock.close()
    return {name: target.result for name, target in targets.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dcpflow(data_dir: str, args) -> tuple[subprocess.Popen, int]:
    return start_server(data_dir, args.vbuckets, "--allow-plain-over-tcp", *args.server_arg)


def memcached_binary() -> str | None:
    binary = shutil.which("memcached") or "/usr/bin/memcached"
    return binary if os.path.exists(binary) else None


def start_memcached() -> tuple[subprocess.Popen, int]:
    binary = memcached_binary()
    if binary is None:
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
                   help="start each phase at once, while the flusher may still be persisting the SET phase")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `dcpflow server` (repeatable), e.g. --server-arg=--flush-interval=1")
    p.add_argument("--subdoc", action="store_true",
                   help="also measure single-spec mutate_in / lookup_in against SET / GET (dcpflow only)")
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run that checks the bench works (dcpflow alone if memcached is missing)")
    p.add_argument("--durability", choices=sorted(kv_durable.LEVELS),
                   help="durable against plain SETs on a 3-node cluster (bench/kv_durable.py)")
    p.add_argument("--replicas", type=int, default=1, help="with --durability: replicas per vbucket (default 1)")
    p.add_argument("--conns", type=int, default=8, help="with --durability: connections per node (default 8)")
    p.add_argument("--ordered", action="store_true",
                   help="with --durability: no HELLO UnorderedExecution (each connection answers in order)")
    p.add_argument("--durable-ops", type=int, default=20_000,
                   help="with --durability: durable SETs per round (default 20000)")
    args = p.parse_args()
    if args.durability:
        if args.smoke:
            args.ops, args.durable_ops, args.keys, args.repeat, args.vbuckets = 2_000, 500, 200, 1, 16
        elif args.vbuckets == 1024:
            args.vbuckets = 64
        return kv_durable.run(args)
    if args.subdoc:
        args.no_memcached = True
    if args.smoke:
        args.ops, args.keys, args.repeat, args.vbuckets = 2_000, 200, 1, 64
        if not args.no_memcached and memcached_binary() is None:
            print("smoke: memcached is not installed, so dcpflow is measured alone and no ratio is printed "
                  "(apt-get install -y memcached for the comparison)")
            args.no_memcached = True

    value = json_value(args.value_size) if args.subdoc else random_value(args.value_size)
    procs = []
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        try:
            proc, port = start_dcpflow(tmp, args)
            procs.append(proc)
            targets = {"dcpflow": Target(port, args, True, value)}
            if not args.no_memcached:
                proc, port = start_memcached()
                procs.append(proc)
                targets["memcached"] = Target(port, args, False, value)
            results = measure(targets, args)
        finally:
            for proc in procs:
                stop(proc)

    print(f"KV throughput, one pipelined client, window {args.window} x depth {args.depth}, "
          f"{args.value_size}-byte values, "
          f"{args.keys} keys, best of {args.repeat} x {args.ops} ops per phase")
    for name, r in results.items():
        print(f"  {name:10s} SET {r['set']:>10,.0f} ops/s   GET {r['get']:>10,.0f} ops/s")
        if args.subdoc:
            print(f"  {name:10s} mutate_in {r['mutate_in']:>10,.0f} ops/s   lookup_in {r['lookup_in']:>10,.0f} ops/s")
            print(f"  ratio mutate_in/SET {r['mutate_in'] / r['set']:.2f}x   lookup_in/GET "
                  f"{r['lookup_in'] / r['get']:.2f}x (target >= 0.7x; one spec each, JSON documents)")
    if not args.no_settle and "dcpflow" in results:
        print(f"  (each phase started once dcpflow had persisted what came before: up to "
              f"{results['dcpflow']['settle']:.1f} s; --no-settle starts them at once, beside its flusher)")
    if "memcached" in results:
        d, m = results["dcpflow"], results["memcached"]
        print(f"  ratio dcpflow/memcached: SET {d['set'] / m['set']:.2f}x   GET {d['get'] / m['get']:.2f}x "
              f"(target >= 0.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
