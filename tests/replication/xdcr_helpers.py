"""Helpers of the XDCR tests: read a bucket's documents with their metadata, wait for conditions,
and run replicators on an event loop of their own (in a thread) or as `dcpflow xdcr` processes."""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dcpflow
from dcpflow.protocol.meta import GetMeta, GetMetaResponse
from dcpflow.protocol.status import Status
from dcpflow.replication.xdcr import Settings, XdcrReplicator
from tests.server.client import RawClient


def bucket_view(port: int, keys, num_vbuckets: int = 64) -> dict:
    """{key: (deleted, cas, rev seqno, flags, value)} of the keys that exist (tombstones too, with flags
    and value None)."""
    out = {}
    c = RawClient(port)
    c.num_vbuckets = num_vbuckets
    with c.login():
        for key in keys:
            c.send(GetMeta(key, 2, c.vbucket_of(key), c.next_opaque()).encode())
            meta = GetMetaResponse.from_frame(c.recv())
            if meta.status == Status.KEY_ENOENT:
                continue
            assert meta.status == Status.SUCCESS, (key, meta.status)
            value = None
            if not meta.is_deleted:
                got = c.get(key)
                value = got.value if got.status == Status.SUCCESS else None
            # A tombstone's flags are left out: a DCP deletion carries none (deletion.md), so no
            # replicator can copy them, and conflict resolution orders deletions by (rev, CAS) alone.
            flags = None if meta.is_deleted else meta.flags
            out[key] = (meta.is_deleted, meta.cas, meta.rev_seqno, flags, value)
    return out


def wait_for(condition, timeout: float = 120.0, what: str = "condition"):
    """Poll `condition` until it returns something truthy (returned), or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


#: replicators started and not stopped yet: tests/replication/conftest.py stops those a test left
#: running (a replicator retries a server that went away for ever, and would reach whichever
#: server of a later test is given its port)
RUNNING: "set[InProcess]" = set()


class InProcess:
    """A replicator on its own event loop in a thread: `stop()` checkpoints and ends it."""

    def __init__(self, source_url: str, target_url: str, state_dir, settings: Settings | None = None,
                 user: str = "Administrator", password: str = "password"):
        self.replicator = XdcrReplicator(source_url, target_url, username=user, password=password,
                                         state_dir=state_dir, settings=settings)
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="dcpflow-test-xdcr")
        self._started = threading.Event()
        self._thread.start()
        RUNNING.add(self)
        try:
            self._started.wait(60)
            self.run(self.replicator.ready.wait())
        except BaseException:  # not ready in time: not left running either
            with contextlib.suppress(BaseException):
                self.stop()
            raise

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main():
            self._stop = asyncio.Event()
            self._started.set()
            await self.replicator.run(self._stop)

        try:
            self.loop.run_until_complete(main())
        except BaseException as e:  # kept for the test to see
            self.error = e
            self._started.set()
        finally:  # no thread of this loop outlives the test
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def run(self, coro, timeout: float = 60.0):
        if self.error is not None:
            raise self.error
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def stats(self) -> dict:
        return dict(self.replicator.stats)

    def stop(self) -> dict:
        if self._thread.is_alive() and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(60)
        assert not self._thread.is_alive(), "replicator did not stop"
        RUNNING.discard(self)
        if self.error is not None:
            raise self.error
        return self.stats


class XdcrProcess:
    """`python -m dcpflow.cli xdcr ...`; `status()` reads its status.json."""

    def __init__(self, source_url: str, target_url: str, state_dir: Path, *args: str):
        env = dict(os.environ)
        src = str(Path(dcpflow.__file__).resolve().parents[1])
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        self.state_dir = Path(state_dir)
        self.log = open(self.state_dir.parent / (self.state_dir.name + ".log"), "a")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "dcpflow.cli", "xdcr", source_url, target_url,
                                      "-u", "Administrator", "-p", "password", "--state-dir", str(state_dir), *args],
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, text=True)
        self.metrics_url = None
        line = self.proc.stdout.readline()
        if line.startswith("dcpflow xdcr metrics: "):
            self.metrics_url = line.split(": ", 1)[1].strip()
            line = self.proc.stdout.readline()
        if "dcpflow xdcr ready" not in line:
            self.proc.kill()
            self.proc.wait(30)
            raise AssertionError(f"no ready line: {line!r}; see {self.log.name}")

    def status(self) -> dict | None:
        try:
            return json.loads((self.state_dir / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def terminate(self, sig=signal.SIGTERM) -> tuple[int, str]:
        self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=60)
        self.log.close()
        return self.proc.returncode, out

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.proc.stdout.close()
        if not self.log.closed:
            self.log.close()
