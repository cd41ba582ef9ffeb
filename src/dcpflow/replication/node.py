"""A node of a `dcpflow cluster` as a child process: `NodeProcess` starts `python -m dcpflow.node`
(the node runner, at the command line's level: it runs a server, which replication never
imports), waits for its ready line, stops or kills it.
"""

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

#: The first line a node prints once it serves (dcpflow/node.py).
READY_PREFIX = "dcpflow node ready:"
_MGMT_PORT = re.compile(r" mgmt_port=(\d+)")


class NodeProcess:
    """A node as a child process: started, waited for (its ready line), stopped or killed.
    `mgmt_port` 0 lets the first start pick a free management port; a restart keeps the port the
    node had, so the map the manager pushed stays right. `cluster_dir`: see dcpflow/node.py's
    `--cluster-dir`."""

    def __init__(self, data_dir: str | Path, port: int, ports: list[int], *, host: str = "127.0.0.1",
                 vbuckets: int = 64, bucket: str = "default", users: str | None = None,
                 flush_interval: float = 0.05, synchronous: str = "NORMAL", log_path: str | Path | None = None,
                 debug: bool = False, mgmt_port: int = 0, cluster_dir: str | Path | None = None,
                 allow_plain_over_tcp: bool = False):
        self.data_dir = Path(data_dir)
        self.host, self.port = host, port
        self.mgmt_port = mgmt_port
        self.args = [sys.executable, "-m", "dcpflow.node", "--data-dir", str(self.data_dir),
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
