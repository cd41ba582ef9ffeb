"""One node of a `dcpflow cluster`: a dcpflow server that knows it is one of several.

`python -m dcpflow.node --data-dir DIR --port P --ports P0,P1,P2 [...]` runs in the foreground like
`dcpflow server`, prints one ready line (with its KV and management ports) and shuts down cleanly
on SIGTERM/SIGINT. Each node has its own management listener (`--mgmt-port`, a free one by
default); the cluster manager puts every node's in the map it pushes. Unlike a single server it
creates no vbuckets: the cluster manager sets every vbucket's state with SET_VBUCKET and pushes
the map with SET_CLUSTER_CONFIG. replication/node.py's `NodeProcess` starts one as a child
process. With `--cluster-dir` (the cluster's data dir, whose cluster.json names the manager's
control channel) the node's fault injection can fail a node over: `POST /faults/nodes/failover`
on any node asks the manager for the hard failover `dcpflow cluster failover` does.

A tool at the command line's level, as `dcpflow server` is: it runs a server and reaches the
cluster manager through replication's control channel, so it imports both (the replication
package itself never imports the server).
"""

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from .replication.node import READY_PREFIX


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dcpflow.node", description=__doc__)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ports", required=True, help="every node's KV port, comma-separated, in node order")
    p.add_argument("--vbuckets", type=int, default=64)
    p.add_argument("--bucket", default="default")
    p.add_argument("--mgmt-port", type=int, default=0,
                   help="HTTP management port (REST, /metrics, /ui/); default 0: a free one")
    p.add_argument("--users", help="users file (JSON); default Administrator/password")
    p.add_argument("--allow-plain-over-tcp", action="store_true",
                   help="also offer SASL PLAIN on the plain-TCP port, as `dcpflow server` does")
    p.add_argument("--flush-interval", type=float, default=0.05)
    p.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="NORMAL",
                   help="SQLite durability: NORMAL survives kill -9 (the default here), FULL power loss")
    p.add_argument("--cluster-dir", help="the cluster's data dir: POST /faults/nodes/failover on this node asks "
                   "the manager found there to fail a node over")
    p.add_argument("--exit-with", type=int, metavar="PID",
                   help="shut down (cleanly) when process PID is gone: the manager that started this node")
    p.add_argument("--debug", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .protocol.config import Node
    from .server import Server, ServerConfig

    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ports = [int(p) for p in args.ports.split(",")]
    if args.port not in ports or len(ports) < 2:
        print(f"dcpflow node: --port {args.port} must be one of --ports {args.ports} (at least two nodes)",
              file=sys.stderr)
        return 2
    config = ServerConfig(data_dir=args.data_dir, host=args.host, port=args.port, buckets=(args.bucket,),
                          num_vbuckets=args.vbuckets, flush_interval=args.flush_interval, users=args.users,
                          synchronous=args.synchronous, debug=args.debug, mgmt_port=args.mgmt_port,
                          plain_over_tcp=args.allow_plain_over_tcp,
                          nodes=[Node(p, hostname=args.host) for p in ports], this_node=ports.index(args.port))

    async def serve() -> int:
        server = Server(config)
        try:
            await server.start()
        except (OSError, ValueError) as e:
            print(f"dcpflow node: cannot start: {e}", file=sys.stderr)
            return 1
        if args.cluster_dir:
            server.faults.node_failover = manager_failover(args.cluster_dir)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"{READY_PREFIX} port={server.port} mgmt_port={server.mgmt.port} pid={os.getpid()} "
              f"data_dir={args.data_dir}", flush=True)
        if args.exit_with:
            loop.create_task(_watch_parent(args.exit_with, stop))
        await stop.wait()
        await server.close()
        return 0

    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve())
    return uvloop.run(serve())


def manager_failover(cluster_dir: str | Path):
    """The node's hook for fault injection (server/faults): a hard failover of a node, asked of
    the cluster manager over its control channel (commands.py), as `dcpflow cluster failover`
    asks it. The manager's refusals (an unknown node, one already failed over, the last one)
    come back as the fault's 400."""
    from .replication.cluster import ClusterError
    from .replication.control import control
    from .server.faults import FaultError

    async def failover(address: str) -> dict:
        try:
            return await asyncio.to_thread(control, cluster_dir, "failover", timeout=120.0, node=address)
        except ClusterError as e:
            raise FaultError(str(e), "node") from None

    return failover


async def _watch_parent(pid: int, stop: asyncio.Event) -> None:
    """A node whose manager died (even by kill -9) stops instead of lingering."""
    while not stop.is_set():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(f"dcpflow node: process {pid} is gone: shutting down", file=sys.stderr, flush=True)
            stop.set()
            return
        except PermissionError:
            pass
        await asyncio.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
