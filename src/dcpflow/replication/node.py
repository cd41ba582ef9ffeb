"""One node of a `dcpflow cluster`: a dcpflow server that knows it is one of several.

`python -m dcpflow.replication.node --data-dir DIR --port P --ports P0,P1,P2 [...]` runs in the
foreground like `dcpflow server`, prints one ready line (with its KV and management ports) and shuts
down cleanly on SIGTERM/SIGINT. Each node has its own management listener (`--mgmt-port`, a free
one by default); the cluster manager puts every node's in the map it pushes.
Unlike a single server it creates no vbuckets: the cluster manager sets every vbucket's state with
SET_VBUCKET and pushes the map with SET_CLUSTER_CONFIG. `NodeProcess` starts one as a child process.
With `--cluster-dir` (the cluster's data dir, whose cluster.json names the manager's control
channel) the node's fault injection can fail a node over: `POST /faults/nodes/failover` on any node
asks the manager for the hard failover `dcpflow cluster failover` does.
"""

import argparse
import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

READY_PREFIX = "dcpflow node ready:"
_MGMT_PORT = re.compile(r" mgmt_port=(\d+)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dcpflow.replication.node", description=__doc__)
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
    from dcpflow.protocol.config import Node
    from dcpflow.server import Server, ServerConfig

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
    from dcpflow.server.faults import FaultError

    from .cluster import ClusterError
    from .control import control

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


class NodeProcess:
    """A node as a child process: started, waited for (its ready line), stopped or killed.
    `mgmt_port` 0 lets the first start pick a free management port; a restart keeps the port the
    node had, so the map the manager pushed stays right. `cluster_dir`: see `--cluster-dir`."""

    def __init__(self, data_dir: str | Path, port: int, ports: list[int], *, host: str = "127.0.0.1",
                 vbuckets: int = 64, bucket: str = "default", users: str | None = None,
                 flush_interval: float = 0.05, synchronous: str = "NORMAL", log_path: str | Path | None = None,
                 debug: bool = False, mgmt_port: int = 0, cluster_dir: str | Path | None = None,
                 allow_plain_over_tcp: bool = False):
        self.data_dir = Path(data_dir)
        self.host, self.port = host, port
        self.mgmt_port = mgmt_port
        self.args = [sys.executable, "-m", "dcpflow.replication.node", "--data-dir", str(self.data_dir),
                     "--host", host, "--port", str(port), "--ports", ",".join(map(str, ports)),
                     "--vbuckets", str(vbuckets), "--bucket", bucket, "--flush-interval", str(flush_interval),
                     "--synchronous", synchronous]
        if users:
            self.args += ["--users", str(users)]
        if debug:
            self.args.append("--debug")
        if allow_plain_over_tcp:
            self.args.append("--allow-plain-over-tcp")
        if cluster_dir is not None:
            self.args += ["--cluster-dir", str(cluster_dir)]
        self.args += ["--exit-with", str(os.getpid())]
        self.log_path = Path(log_path) if log_path else self.data_dir / "node.log"
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 30.0) -> "NodeProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*self.args, "--mgmt-port", str(self.mgmt_port)], stdout=subprocess.PIPE,
                                         stderr=log, env=env, text=True, start_new_session=True)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or not line[0].startswith(READY_PREFIX):
            self.kill()
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise RuntimeError(f"node on port {self.port} did not start: {line[0] if line else 'no ready line'} "
                               f"{tail}")
        mgmt = _MGMT_PORT.search(line[0])
        if mgmt is not None:
            self.mgmt_port = int(mgmt.group(1))
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (clean shutdown: everything flushed, no failover entry on the next start)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._close_pipes()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash (unflushed writes lost, a failover entry on the next start)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._close_pipes()

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()


if __name__ == "__main__":
    sys.exit(main())
