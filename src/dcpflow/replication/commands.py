"""`dcpflow cluster up | status | failover | rebalance | down`: a cluster of dcpflow nodes on one machine.

`up` starts the nodes (node i on 127.0.0.1 at --base-port + i; 0 picks free ports), runs the
cluster manager in the foreground, prints one ready line and keeps running until `down` (or
SIGTERM/SIGINT). The other commands find it through `--data-dir`: `cluster.json` there holds the
map and the manager's control port and token (mode 0600). The control channel is one JSON request
and one JSON reply per connection, on 127.0.0.1 only.
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

from .cluster import STATE_FILE, ClusterError, ClusterManager
from .control import ControlServer, control, read_state

READY_PREFIX = "dcpflow cluster ready:"


# ---------------------------------------------------------------------------------------------
# up


#: where the kernel says which ports it hands out itself (Linux; its default is 32768-60999)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: how far below the ephemeral range free_ports looks
SPARE_PORTS = 12_000


def free_ports(n: int, consecutive: bool = False) -> list[int]:
    """N ports free on 127.0.0.1 right now (all bound at once, so they differ; `consecutive`: N
    in a row), below the kernel's ephemeral range: a node restarted after a crash or a failover
    comes back on its port, and a port of the ephemeral range may have been taken meanwhile as
    the local end of any outgoing connection, or by a listener on port 0 (Couchbase's own ports,
    11210 and 8091, are below it too)."""
    try:
        top = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        top = 32768
    bottom = max(1024, top - SPARE_PORTS)
    rng = random.SystemRandom()
    if top - bottom >= 4 * n:
        for _ in range(200):
            base = rng.randrange(bottom, top - n + 1)
            ports = list(range(base, base + n)) if consecutive else rng.sample(range(bottom, top), n)
            if _all_bindable(ports):
                return ports
    raise OSError(f"found no {n} free ports between {bottom} and {top} on 127.0.0.1")


def _all_bindable(ports: list[int]) -> bool:
    socks = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _manager_running(data_dir, pid: int) -> bool:
    """The manager clears its entry in cluster.json once everything is stopped (its process may
    linger a moment longer, or as a zombie of whoever started it)."""
    try:
        entry = read_state(data_dir).get("manager")
    except ClusterError:
        return False
    return bool(entry) and entry.get("pid") == pid and _pid_alive(pid)


def _cluster_of(args: argparse.Namespace, data_dir: Path) -> tuple[ClusterManager, list[int]] | int:
    """The cluster `up` starts, and its nodes' ports: the one cluster.json describes (as it was,
    whatever the options say), else a new one from the options; or the exit code of why not."""
    state_path = data_dir / STATE_FILE
    state = json.loads(state_path.read_text()) if state_path.exists() else None
    if state is not None and state.get("manager") and _pid_alive(state["manager"].get("pid")):
        print(f"dcpflow cluster: already up (manager pid {state['manager']['pid']}); `dcpflow cluster down "
              f"--data-dir {data_dir}` first", file=sys.stderr)
        return 1
    if state is not None:
        ports = [n["port"] for n in state["nodes"]]
        if args.nodes is not None or args.replicas is not None or args.vbuckets is not None:
            print(f"dcpflow cluster: {data_dir} already holds a cluster of {len(ports)} nodes, "
                  f"{state['num_replicas']} replica(s), {state['num_vbuckets']} vbuckets: starting it as it was",
                  file=sys.stderr)
        return ClusterManager.from_state(state, state_path=state_path), ports
    args.nodes = 3 if args.nodes is None else args.nodes
    args.replicas = 1 if args.replicas is None else args.replicas
    args.vbuckets = 64 if args.vbuckets is None else args.vbuckets
    if args.nodes < 1 or args.vbuckets < 1:
        print("dcpflow cluster: --nodes and --vbuckets must be at least 1", file=sys.stderr)
        return 2
    ports = free_ports(args.nodes) if args.base_port == 0 else [args.base_port + i for i in range(args.nodes)]
    try:
        return ClusterManager([("127.0.0.1", p) for p in ports], num_vbuckets=args.vbuckets,
                              num_replicas=args.replicas, state_path=state_path), ports
    except ClusterError as e:
        print(f"dcpflow cluster: {e}", file=sys.stderr)
        return 2


async def run_up(args: argparse.Namespace) -> int:
    from .node import NodeProcess

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    found = _cluster_of(args, data_dir)
    if isinstance(found, int):
        return found
    mgr, ports = found
    if len(ports) < 2:
        print("dcpflow cluster: a cluster needs at least 2 nodes (use `dcpflow server` for one)", file=sys.stderr)
        return 2
    procs = [NodeProcess(data_dir / f"node{i}", p, ports, vbuckets=mgr.num_vbuckets, bucket=mgr.bucket,
                         flush_interval=args.flush_interval, synchronous=args.synchronous,
                         mgmt_port=args.mgmt_base_port + i if args.mgmt_base_port else 0, cluster_dir=data_dir,
                         allow_plain_over_tcp=args.allow_plain_over_tcp)
             for i, p in enumerate(ports)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    control_server = None
    try:
        # First, so that a port taken fails at once. No one can use it before cluster.json
        # names it with its token, after the manager started.
        token = secrets.token_hex(16)
        try:
            control_server = await ControlServer(mgr, token, stop, args.control_port).start()
        except OSError as e:
            print(f"dcpflow cluster: cannot listen on control port {args.control_port} (127.0.0.1): "
                  f"{e.strerror or e}", file=sys.stderr)
            return 1
        try:
            await asyncio.gather(*(asyncio.to_thread(p.start) for p in procs))
        except RuntimeError as e:
            print(f"dcpflow cluster: {e}", file=sys.stderr)
            return 1
        for node, proc in zip(mgr.nodes, procs, strict=True):
            node.process = proc
        mgr.extra_state["node_pids"] = [p.pid for p in procs]

        async def restart(node):
            await asyncio.to_thread(node.process.start)
            mgr.extra_state["node_pids"] = [p.pid for p in procs]

        mgr.restart_node = restart
        try:
            await mgr.start()
        except ClusterError as e:
            print(f"dcpflow cluster: {e}", file=sys.stderr)
            return 1
        mgr.extra_state["manager"] = {"pid": os.getpid(), "control_port": control_server.port, "token": token}
        mgr.save()
        addrs = ",".join(f"127.0.0.1:{p}" for p in ports)
        mgmt = ",".join(f"127.0.0.1:{p.mgmt_port}" for p in procs)
        print(f"{READY_PREFIX} nodes={addrs} replicas={mgr.num_replicas} vbuckets={mgr.num_vbuckets} "
              f"data_dir={data_dir} connstr=couchbase://{addrs} mgmt={mgmt}", flush=True)
        await stop.wait()
        return 0
    finally:
        if control_server is not None:
            control_server.close()
        await mgr.stop()
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs))
        mgr.extra_state.pop("manager", None)
        mgr.extra_state.pop("node_pids", None)
        mgr.save()


# ---------------------------------------------------------------------------------------------
# the other commands


def _print_status(st: dict) -> None:
    print(f"bucket {st['bucket']}: {st['num_vbuckets']} vbuckets, {st['num_replicas']} replica(s), map rev "
          f"{st['rev']}, streams {st['streams']}/{st['streams_wanted']}")
    head = f"{'node':22} {'status':12} {'active':>6} {'replica':>7} {'active seqnos':>14} {'replica seqnos':>15} " \
           f"{'lag':>6} {'max lag':>7}"
    print(head)
    for n in st["nodes"]:
        print(f"{n['node']:22} {n['status']:12} {n['active_vbuckets']:>6} {n['replica_vbuckets']:>7} "
              f"{n['active_high_seqno_total']:>14} {n['replica_high_seqno_total']:>15} "
              f"{n['replication_lag_items']:>6} {n['replication_lag_max']:>7}")
    if st["vbuckets_without_active"]:
        print(f"WARNING: {st['vbuckets_without_active']} vbucket(s) have no active copy")
    if st["vbuckets_without_replica"]:
        print(f"note: {st['vbuckets_without_replica']} vbucket(s) have no replica (rebalance to rebuild them)")


def _cmd(fn):
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except ClusterError as e:
            print(f"dcpflow cluster: {e}", file=sys.stderr)
            return 1
    return run


@_cmd
def cmd_status(args: argparse.Namespace) -> int:
    st = control(args.data_dir, "status", timeout=30)
    if args.json:
        print(json.dumps(st, indent=1))
    else:
        _print_status(st)
    return 0


@_cmd
def cmd_failover(args: argparse.Namespace) -> int:
    result = control(args.data_dir, "failover", node=args.node)
    print(f"failed over {result['failed_over']}: {result['promoted']} vbucket(s) promoted to active on their "
          f"replicas (map rev {result['rev']})" + (f"; {result['without_copy']} had no replica and are "
                                                   f"unavailable" if result["without_copy"] else ""))
    return 0


@_cmd
def cmd_rebalance(args: argparse.Namespace) -> int:
    result = control(args.data_dir, "rebalance", timeout=args.timeout)
    print(f"rebalanced over {result['nodes']} node(s): {result['moved']} active vbucket(s) moved, "
          f"{result['new_copies']} new copies built (map rev {result['rev']})")
    return 0


@_cmd
def cmd_down(args: argparse.Namespace) -> int:
    state = read_state(args.data_dir)
    mgr = state.get("manager")
    if mgr and _pid_alive(mgr.get("pid")):
        with contextlib.suppress(ClusterError):
            control(args.data_dir, "down", timeout=30)
        deadline = time.monotonic() + args.timeout
        while _manager_running(args.data_dir, mgr["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _manager_running(args.data_dir, mgr["pid"]):
            raise ClusterError(f"the manager (pid {mgr['pid']}) did not stop within {args.timeout:g} s")
        print("cluster stopped")
        return 0
    # No manager (it was killed): stop the nodes it left, if any.
    pids = [pid for pid in state.get("node_pids", []) if _pid_alive(pid)]
    if not pids:
        raise ClusterError(f"the cluster in {args.data_dir} is not running")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    print(f"the manager was gone; stopped {len(pids)} node(s)")
    return 0


def add_command(sub) -> None:
    p = sub.add_parser("cluster", help="run a multi-node dcpflow cluster on this machine (replicas, failover, "
                       "rebalance)", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    csub = p.add_subparsers(dest="cluster_command", required=True)

    up = csub.add_parser("up", help="start the nodes and the cluster manager (foreground; one ready line)")
    up.add_argument("--nodes", type=int, help="number of nodes (default 3)")
    up.add_argument("--replicas", type=int, help="replicas per vbucket, 0-3 (default 1)")
    up.add_argument("--vbuckets", type=int, help="vbuckets of the bucket (default 64)")
    up.add_argument("--data-dir", default="./cluster", help="where nodes keep their data and the cluster its "
                    "state (default ./cluster)")
    up.add_argument("--base-port", type=int, default=12000, help="node i listens on 127.0.0.1 at BASE+i "
                    "(default 12000; 0 picks free ports)")
    up.add_argument("--mgmt-base-port", type=int, default=0, help="node i serves its HTTP management API "
                    "(REST, /metrics, /ui/) at BASE+i (default 0: free ports, printed in the ready line)")
    up.add_argument("--flush-interval", type=float, default=0.05, metavar="SECONDS",
                    help="how often nodes persist writes (default 0.05)")
    up.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="NORMAL",
                    help="SQLite durability of the nodes: NORMAL survives kill -9 (default), FULL power loss")
    up.add_argument("--allow-plain-over-tcp", action="store_true",
                    help="every node also offers SASL PLAIN on its plain-TCP port (by default only over TLS: "
                    "it sends the password in clear), for clients that speak only PLAIN")
    up.add_argument("--control-port", type=int, default=0,
                    help="the cluster manager's control port on 127.0.0.1, recorded in cluster.json for "
                    "`dcpflow cluster status|failover|rebalance|down` (default 0: a free one)")

    up.set_defaults(func=lambda args: asyncio.run(run_up(args)))

    for name, fn, helptext in (("status", cmd_status, "per node: vbuckets, high seqnos, replication lag"),
                               ("rebalance", cmd_rebalance, "spread vbuckets evenly over the nodes that are up"),
                               ("down", cmd_down, "stop the manager and every node (clean shutdown)")):
        c = csub.add_parser(name, help=helptext)
        c.add_argument("--data-dir", default="./cluster")
        if name == "status":
            c.add_argument("--json", action="store_true", help="print the status as JSON")
        if name in ("rebalance", "down"):
            c.add_argument("--timeout", type=float, default=600.0 if name == "rebalance" else 60.0)
        c.set_defaults(func=fn)
    f = csub.add_parser("failover", help="fail a node over: promote the replicas of its active vbuckets")
    f.add_argument("node", help="the node, as 127.0.0.1:PORT")
    f.add_argument("--data-dir", default="./cluster")
    f.set_defaults(func=cmd_failover)
