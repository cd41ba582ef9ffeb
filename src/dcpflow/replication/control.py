"""The cluster manager's control channel: how `dcpflow cluster status|failover|rebalance|down` (and a
node's fault injection) reach the running manager.

`cluster.json` in the cluster's data dir holds the map and the manager's control port and token
(mode 0600). The channel is one JSON request and one JSON reply per connection, on 127.0.0.1 only:
`ControlServer` answers them in the manager's process, `control()` asks from any other.
"""

import asyncio
import json
import secrets
import socket
from pathlib import Path

from .cluster import STATE_FILE, ClusterError, ClusterManager


class ControlServer:
    """Serves the manager's operations to `dcpflow cluster status|failover|rebalance|down`."""

    def __init__(self, manager: ClusterManager, token: str, stop: asyncio.Event, port: int = 0):
        self.manager = manager
        self.token = token
        self.stop = stop
        self.server: asyncio.AbstractServer | None = None
        self.port = port  # 0: a free one

    async def start(self) -> "ControlServer":
        """Listen on 127.0.0.1 at `port` (OSError if it is taken)."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("not an object")
            except ValueError:
                reply = {"ok": False, "error": "the request must be one JSON object on one line"}
            else:
                reply = await self._handle(req)
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _handle(self, req: dict) -> dict:
        if not secrets.compare_digest(str(req.get("token", "")), self.token):
            return {"ok": False, "error": "bad token: read it from cluster.json in the data dir"}
        cmd = req.get("cmd")
        try:
            if cmd == "status":
                return {"ok": True, "result": await self.manager.status()}
            if cmd == "failover":
                return {"ok": True, "result": await self.manager.failover(str(req.get("node", "")))}
            if cmd == "rebalance":
                return {"ok": True, "result": await self.manager.rebalance()}
            if cmd == "down":
                self.stop.set()
                return {"ok": True, "result": {"stopping": True}}
        except ClusterError as e:
            return {"ok": False, "error": str(e)}
        except Exception as e:  # report it to the operator instead of dropping the connection
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        return {"ok": False, "error": f"unknown command {cmd!r} (status, failover, rebalance, down)"}

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def read_state(data_dir: str | Path) -> dict:
    path = Path(data_dir) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster in {data_dir}: {path} does not exist (start one with `dcpflow cluster up "
                           f"--data-dir {data_dir}`)") from None
    except ValueError as e:
        raise ClusterError(f"{path} is not valid JSON ({e})") from None


def control(data_dir: str | Path, cmd: str, timeout: float = 600.0, **args) -> dict:
    """Send one command to the running manager; returns its result or raises ClusterError."""
    state = read_state(data_dir)
    mgr = state.get("manager")
    if not mgr:
        raise ClusterError(f"the cluster in {data_dir} is not running (start it with `dcpflow cluster up "
                           f"--data-dir {data_dir}`)")
    try:
        with socket.create_connection(("127.0.0.1", mgr["control_port"]), timeout=10) as sock:
            sock.settimeout(timeout)
            sock.sendall(json.dumps({"cmd": cmd, "token": mgr["token"], **args}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as e:
        raise ClusterError(f"the cluster manager (pid {mgr.get('pid')}, control port {mgr['control_port']}) does "
                           f"not answer: {e}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise ClusterError("the cluster manager sent no reply") from None
    if not reply.get("ok"):
        raise ClusterError(reply.get("error", "failed"))
    return reply["result"]
