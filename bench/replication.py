"""Replication lag and throughput of a `dcpflow cluster` (3 nodes, 1 replica), with a baseline
measured in the same run.

`dcpflow cluster up` runs as a subprocess (the nodes and the manager that relays DCP between them,
each its own process). This process writes; an observer process reads.

* Lag - a paced writer SETs documents whose value carries the send time (ns) to their active node
  over plain KV connections. The observer holds one DCP stream per vbucket per node, opened at the
  current high seqno: on the replica node for vbuckets it replicates, on the active node for the
  others. For each mutation it sees it records (now - send time):
  - baseline: write -> active -> DCP reader of the active (what any DCP client sees),
  - replica:  write -> active -> relay -> consumer applies on the replica -> DCP reader of the
    replica. The difference is what replication adds; the replica figure bounds the write-to-apply
    lag from above (it includes one more DCP hop out of the replica).
  p50/p99 of both, and their ratio.
* Throughput - an unpaced writer pipelines SETs for a few seconds (acknowledged writes/s), then the
  replicas' high seqnos are polled until they equal the actives': replicated items/s over the whole
  burst, and its ratio to the write rate (1.0 = replication keeps up).

    .venv/bin/python bench/replication.py                     # 3 nodes, 64 vbuckets, 2000 writes/s
    .venv/bin/python bench/replication.py --rate 5000 --seconds 10 --value-size 1000
    .venv/bin/python bench/replication.py --smoke          # seconds: 16 vbuckets, 200 writes/s, 1 s phases
"""

import argparse
import functools
import json
import multiprocessing as mp
import os
import re
import selectors
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dcpflow.protocol import dcp, kv
from dcpflow.protocol.config import parse_cluster_map
from dcpflow.protocol.dcp import OpenFlag, StreamFlag
from dcpflow.protocol.frame import request
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from serverproc import call as blocking_call
from serverproc import child_env, login

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"dcpflow cluster ready: nodes=(\S+) ")
_HEAD = struct.Struct(">BBHBBHI").unpack_from  # magic, opcode, keylen, extlen, datatype, vb/status, bodylen
MAX = 0xFFFFFFFFFFFFFFFF
T_PREFIX = b'{"t":'



def connect(port: int):
    """(socket, decoder, call): a logged-in KV connection with bucket `default` selected."""
    sock, d = login(port, b"bench/replication")
    return sock, d, functools.partial(blocking_call, sock, d)


# ---------------------------------------------------------------------------------------------
# the observer (its own process)


def observe(ports: list[int], roles: dict, stop, ready, out_path: str) -> None:
    """roles: {(node, vb): "active" | "replica"}; writes {"active": [...ns], "replica": [...ns]}."""
    sel = selectors.DefaultSelector()
    lags: dict[str, list[int]] = {"active": [], "replica": []}
    conns = []
    for node, port in enumerate(ports):
        vbs = sorted(vb for (n, vb) in roles if n == node)
        if not vbs:
            continue
        sock, d, call = connect(port)
        assert call(dcp.DcpOpen(f"bench-observer-{node}".encode(), OpenFlag.PRODUCER).encode()).status == 0
        assert call(dcp.DcpControl(b"connection_buffer_size", b"20971520").encode()).status == 0
        for vb in vbs:
            req = dcp.DcpStreamRequest(vb, 0, MAX, 0, 0, 0, StreamFlag.FROM_LATEST, opaque=vb)
            reply = call(req.encode())
            assert reply.status == Status.SUCCESS, (node, vb, reply)
        assert not d.buffered  # nothing streams yet: the writers have not started
        sock.setblocking(False)
        state = {"node": node, "buf": bytearray(), "unacked": 0, "sock": sock}
        sel.register(sock, selectors.EVENT_READ, state)
        conns.append(state)
    ready.set()
    while not stop.is_set():
        for key, _ in sel.select(0.1):
            st = key.data
            try:
                data = st["sock"].recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                raise SystemExit(f"node {st['node']} closed the observer's connection")
            now = time.time_ns()
            buf = st["buf"]
            buf += data
            pos, end = 0, len(buf)
            while end - pos >= 24:
                magic, op, klen, elen, _dt, vb, blen = _HEAD(buf, pos)
                fend = pos + 24 + blen
                if fend > end:
                    break
                if op == 0x57 and magic == 0x80:
                    v = pos + 24 + elen + klen
                    if buf[v:v + 5] == T_PREFIX:
                        t_end = buf.index(b",", v)
                        sent = int(buf[v + 5:t_end])
                        lags[roles[(st["node"], vb)]].append(now - sent)
                st["unacked"] += fend - pos
                pos = fend
            del buf[:pos]
            if st["unacked"] > 4 * 1024 * 1024:
                st["sock"].sendall(dcp.DcpBufferAck(st["unacked"]).encode())
                st["unacked"] = 0
    with open(out_path, "w") as fh:
        json.dump(lags, fh)


# ---------------------------------------------------------------------------------------------
# writers


class Writer:
    """One pipelined KV connection per node; documents go to their vbucket's active node."""

    def __init__(self, ports: list[int], vmap, num_vbuckets: int, value_size: int):
        self.conns = [connect(p)[:2] for p in ports]
        self.vmap = vmap
        self.nv = num_vbuckets
        self.pad = b"x" * value_size
        self.sent = 0
        self.failed = False

    def batch(self, keys: list[bytes]) -> int:
        """SET every key (pipelined per node); returns how many succeeded."""
        per_node: dict[int, list[bytes]] = {}
        now = time.time_ns()
        for key in keys:
            vb = vbucket_for_key(key, self.nv)
            node = self.vmap[vb][0]
            value = b'{"t":%d,"p":"%s"}' % (now, self.pad)
            per_node.setdefault(node, []).append(
                request(Opcode.SET, key=key, extras=b"\0\0\0\0\0\0\0\0", value=value, vbucket=vb))
        ok = 0
        for node, reqs in per_node.items():
            sock, _ = self.conns[node]
            sock.sendall(b"".join(reqs))
        for node, reqs in per_node.items():
            sock, d = self.conns[node]
            got = 0
            while got < len(reqs):
                frame = d.next_frame()
                if frame is None:
                    d.feed(sock.recv(1 << 20))
                    continue
                got += 1
                if frame.status == Status.SUCCESS:
                    ok += 1
                elif not self.failed:
                    print(f"a SET failed with status 0x{frame.status:x}", file=sys.stderr)
                    self.failed = True
        self.sent += len(keys)
        return ok


def seqnos(port: int, state: int) -> dict[int, int]:
    sock, _, call = connect(port)
    try:
        reply = call(kv.GetAllVbSeqnos(state).encode())
        return kv.GetAllVbSeqnosResponse.from_frame(reply).as_dict()
    finally:
        sock.close()


def pct(values: list[int], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--vbuckets", type=int, default=64)
    ap.add_argument("--rate", type=int, default=2000, help="paced writes per second for the lag phase")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--smoke", action="store_true",
                    help="a seconds-long run that checks the bench works: 16 vbuckets, 200 writes/s, 1 s phases")
    args = ap.parse_args()
    if args.smoke:
        args.vbuckets, args.rate, args.seconds, args.keys = 16, 200, 1.0, 1_000

    data = tempfile.mkdtemp(prefix="bench-replication-")
    up = subprocess.Popen([sys.executable, "-m", "dcpflow.cli", "cluster", "up", "--nodes", str(args.nodes),
                           "--replicas", "1", "--vbuckets", str(args.vbuckets), "--base-port", "0",
                           "--data-dir", data], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=child_env())
    try:
        line = up.stdout.readline()
        m = READY.search(line)
        if m is None:
            print("cluster did not start:", line, up.stderr.read(), file=sys.stderr)
            return 1
        ports = [int(a.rsplit(":", 1)[1]) for a in m.group(1).split(",")]
        sock, _, call = connect(ports[0])
        cmap = parse_cluster_map(call(request(Opcode.GET_CLUSTER_CONFIG)).value)
        sock.close()
        vmap = [list(c) for c in cmap.vbucket_map]
        # Observe each vbucket on its replica for two thirds of them, on its active for the rest.
        roles = {}
        for vb, (a, r) in enumerate(vmap):
            if vb % 3:
                roles[(r, vb)] = "replica"
            else:
                roles[(a, vb)] = "active"
        ctx = mp.get_context("fork")
        stop, ready = ctx.Event(), ctx.Event()
        out = os.path.join(data, "lags.json")
        obs = ctx.Process(target=observe, args=(ports, roles, stop, ready, out), daemon=True)
        obs.start()
        assert ready.wait(60), "observer did not start"
        writer = Writer(ports, vmap, args.vbuckets, args.value_size)
        keys = [b"bench%d" % i for i in range(args.keys)]

        # -- phase 1: paced writes, lag ------------------------------------------------------------
        tick = 0.01
        per_tick = max(1, round(args.rate * tick))
        start = time.perf_counter()
        i = 0
        while (elapsed := time.perf_counter() - start) < args.seconds:
            due = int(elapsed / tick) * per_tick
            if writer.sent < due:
                n = due - writer.sent
                writer.batch([keys[(i + j) % len(keys)] for j in range(n)])
                i += n
            else:
                time.sleep(tick / 4)
        paced_rate = writer.sent / (time.perf_counter() - start)
        time.sleep(1.0)  # let the tail arrive
        stop.set()
        obs.join(60)
        with open(out) as fh:
            lags = json.load(fh)

        # -- phase 2: unpaced writes, throughput -------------------------------------------------------
        before = {n: seqnos(p, 1) for n, p in enumerate(ports)}
        total_before = sum(sum(s.values()) for s in before.values())
        t0 = time.perf_counter()
        written = 0
        while time.perf_counter() - t0 < args.seconds:
            written += writer.batch([keys[(i + j) % len(keys)] for j in range(600)])
            i += 600
        t_write = time.perf_counter() - t0
        after = {n: seqnos(p, 1) for n, p in enumerate(ports)}
        active_high = {vb: after[a][vb] for vb, (a, _r) in enumerate(vmap)}
        while True:
            replicas = {}
            for n, p in enumerate(ports):
                replicas.update({vb: s for vb, s in seqnos(p, 2).items() if vmap[vb][1] == n})
            if all(replicas.get(vb, 0) >= h for vb, h in active_high.items()):
                break
            time.sleep(0.01)
            if time.perf_counter() - t0 > 10 * args.seconds + 60:
                print("replicas did not catch up", file=sys.stderr)
                return 1
        t_repl = time.perf_counter() - t0
        items = sum(active_high.values()) - total_before

        a50, a99 = pct(lags["active"], 50), pct(lags["active"], 99)
        r50, r99 = pct(lags["replica"], 50), pct(lags["replica"], 99)
        print(f"cluster: {args.nodes} nodes, 1 replica, {args.vbuckets} vbuckets, {args.value_size}-byte values")
        print(f"lag at {paced_rate:,.0f} writes/s for {args.seconds:g}s "
              f"({len(lags['replica'])} replica samples, {len(lags['active'])} baseline samples):")
        print(f"  baseline write -> DCP reader of the active : p50 {a50:7.2f} ms  p99 {a99:7.2f} ms")
        print(f"  write -> replica applied -> DCP reader     : p50 {r50:7.2f} ms  p99 {r99:7.2f} ms")
        print(f"  ratio replica/baseline                     : p50 {r50 / a50:5.2f}x   p99 {r99 / a99:5.2f}x")
        print(f"throughput, unpaced pipelined SETs for {t_write:.1f}s:")
        print(f"  written    : {written / t_write:10,.0f} writes/s acknowledged ({items:,} seqnos)")
        print(f"  replicated : {items / t_repl:10,.0f} items/s (replicas caught up {t_repl - t_write:.2f}s after "
              f"the last write)")
        print(f"  ratio replicated/written: {items / t_repl / (written / t_write):.2f}x")
        return 0
    finally:
        subprocess.run([sys.executable, "-m", "dcpflow.cli", "cluster", "down", "--data-dir", data],
                       capture_output=True, env=child_env(), timeout=120)
        if up.poll() is None:
            up.terminate()
            up.wait(60)
        up.stdout.close()
        up.stderr.close()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
