"""`bench/kv.py --durability LEVEL`: durable SETs against plain SETs on the same 3-node cluster.

`dcpflow cluster up` (3 nodes, --replicas 1 by default) runs as a subprocess. The client keeps
--conns connections to every node and sends each document to its vbucket's active node, in
windows pipelined on every connection at once; a phase of plain SETs and a phase of SETs with the
durability frame info (https://github.com/couchbase/kv_engine/blob/master/docs/BinaryProtocol.md,
frame info 0x01) take turns round by round over the same connections and keys, and the best round
of each counts. A durable SET is answered once its level is met (the replica acknowledged the
prepare over DCP; for the persist levels, once persisted too). The connections ask for HELLO
UnorderedExecution, as the official SDKs do, so the durable SETs of a window wait for their
replicas together; with --ordered they do not, and a connection answers in order: a window then
costs one durable round trip per request, and --conns sets how many writes are in flight per node.
"""

import functools
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dcpflow.protocol.config import parse_cluster_map
from dcpflow.protocol.frame import durability_frame, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from serverproc import call as blocking_call
from serverproc import child_env, login

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"dcpflow cluster ready: nodes=(\S+) ")
LEVELS = {"majority": 1, "majority_and_persist_active": 2, "persist_to_majority": 3}



def _connect(port: int, unordered: bool = True):
    """(socket, decoder, call): a logged-in KV connection with bucket `default` selected."""
    features = (Feature.TCP_NODELAY, Feature.SYNC_REPLICATION) + ((Feature.UNORDERED_EXECUTION,) if unordered else ())
    sock, d = login(port, b"bench/kv-durable", features=features)
    return sock, d, functools.partial(blocking_call, sock, d)


def _windows(keys_by_node, value: bytes, framing: bytes, window: int, vbuckets: int, conns: int):
    """Per (node, connection): pre-encoded windows of SETs of that node's keys."""
    out = {}
    for node, keys in keys_by_node.items():
        for c in range(conns):
            mine = keys[c::conns]
            wins = []
            for start in range(0, len(mine), window):
                reqs = [request(Opcode.SET, key=k, extras=bytes(8), value=value, vbucket=vbucket_for_key(k, vbuckets),
                                opaque=i, framing=framing) for i, k in enumerate(mine[start:start + window])]
                wins.append((b"".join(reqs), len(reqs)))
            out[(node, c)] = wins
    return out


def _phase(socks, wins, ops: int) -> float:
    """ops/s: every connection sends its next window, then all replies are read; until `ops`."""
    sel = selectors.DefaultSelector()
    done = rnd = 0
    t0 = time.perf_counter()
    while done < ops:
        want = {}
        for key, (sock, _) in socks.items():
            ws = wins[key]
            if not ws:
                continue
            data, n = ws[rnd % len(ws)]
            sock.sendall(data)
            want[key] = n
            sel.register(sock, selectors.EVENT_READ, key)
        while want:
            for sk, _ in sel.select(60):
                key = sk.data
                sock, d = socks[key]
                d.feed(sock.recv(1 << 20))
                while (frame := d.next_frame()) is not None:
                    if frame.status != Status.SUCCESS:
                        raise RuntimeError(f"a SET failed with status 0x{frame.status:x}")
                    want[key] -= 1
                    done += 1
                if not want[key]:
                    del want[key]
                    sel.unregister(sock)
        rnd += 1
    sel.close()
    return done / (time.perf_counter() - t0)


def run(args) -> int:
    level = LEVELS[args.durability]
    data = tempfile.mkdtemp(prefix="bench-kv-durable-")
    cmd = [sys.executable, "-m", "dcpflow.cli", "cluster", "up", "--nodes", "3", "--replicas", str(args.replicas),
           "--vbuckets", str(args.vbuckets), "--base-port", "0", "--data-dir", data]
    up = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        m = READY.search(up.stdout.readline())
        if m is None:
            print("cluster did not start:", up.stderr.read(), file=sys.stderr)
            return 1
        ports = [int(a.rsplit(":", 1)[1]) for a in m.group(1).split(",")]
        sock, d, call = _connect(ports[0])
        vmap = [list(c) for c in parse_cluster_map(call(request(Opcode.GET_CLUSTER_CONFIG)).value).vbucket_map]
        sock.close()
        keys = [b"bench-key-%08d" % i for i in range(args.keys)]
        by_node: dict[int, list[bytes]] = {}
        for k in keys:
            by_node.setdefault(vmap[vbucket_for_key(k, args.vbuckets)][0], []).append(k)
        value = os.urandom(args.value_size // 2 + 1).hex()[:args.value_size].encode()
        socks = {(n, c): _connect(ports[n], not args.ordered)[:2] for n in by_node for c in range(args.conns)}
        frame = durability_frame(level)
        _wait_durable(socks, by_node, args.vbuckets, frame)  # the manager has told every active its chain
        plain = _windows(by_node, value, b"", args.window, args.vbuckets, args.conns)
        durable = _windows(by_node, value, frame, args.window, args.vbuckets, args.conns)
        _phase(socks, plain, len(keys))  # warm-up: every key exists
        best = {"plain": 0.0, "durable": 0.0}
        for _ in range(args.repeat):
            best["plain"] = max(best["plain"], _phase(socks, plain, args.ops))
            best["durable"] = max(best["durable"], _phase(socks, durable, args.durable_ops))
        for s, _ in socks.values():
            s.close()
    finally:
        subprocess.run([sys.executable, "-m", "dcpflow.cli", "cluster", "down", "--data-dir", data],
                       capture_output=True, env=child_env(), timeout=120)
        if up.poll() is None:
            up.kill()
        up.wait(30)
    print(f"KV SETs on a 3-node dcpflow cluster ({args.replicas} replica(s), {args.vbuckets} vbuckets), "
          f"{args.value_size}-byte values, {args.keys} keys, {args.conns} connection(s) per node, window "
          f"{args.window}, {'in order' if args.ordered else 'unordered execution'}, best of {args.repeat} rounds")
    print(f"  plain SETs               : {best['plain']:>10,.0f} ops/s ({args.ops} ops per round)")
    print(f"  durable SETs ({args.durability}) : {best['durable']:>10,.0f} ops/s "
          f"({args.durable_ops} ops per round)")
    print(f"  ratio durable/plain      : {best['durable'] / best['plain']:.3f}x")
    return 0


def _wait_durable(socks, by_node, vbuckets: int, frame: bytes, timeout: float = 60.0) -> None:
    """Until a durable SET succeeds on every node (DURABILITY_IMPOSSIBLE until its chains are set)."""
    deadline = time.monotonic() + timeout
    for node, keys in by_node.items():
        sock, d = socks[(node, 0)]
        while True:
            reply = blocking_call(sock, d, request(Opcode.SET, key=keys[0], extras=bytes(8), value=b"1",
                                                    vbucket=vbucket_for_key(keys[0], vbuckets), framing=frame))
            if reply.status == Status.SUCCESS:
                break
            if reply.status != Status.DURABILITY_IMPOSSIBLE or time.monotonic() > deadline:
                raise RuntimeError(f"node {node}: a durable SET answered 0x{reply.status:x}")
            time.sleep(0.1)
