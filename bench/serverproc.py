"""Start and stop a `dcpflow server` subprocess for the benchmarks, build the data dir it
serves, make a blocking request on a raw socket, and read a process's CPU time (one copy for
every script).

The child gets this checkout's `src` on PYTHONPATH, so a bench measures the code beside it;
`BENCH_PROFILE=FILE` runs it under cProfile (written when it stops cleanly).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _stat_cpu(path: str) -> float:
    """User + system CPU seconds in a /proc stat file (0 if it cannot be read)."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc; 0 elsewhere or once it is gone):
    with the wall time it tells whether a phase was CPU-bound or starved by a busy machine."""
    return _stat_cpu(f"/proc/{pid}/stat")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """The same for each thread of a process, by thread id (empty elsewhere)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    return {tid: _stat_cpu(f"/proc/{pid}/task/{tid}/stat") for tid in tids}


def child_env() -> dict:
    """The environment of a dcpflow subprocess: this checkout's `src` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_server(data_dir: str, vbuckets: int, *extra: str) -> tuple[subprocess.Popen, int]:
    """Start the server on a free port and wait for its ready line; returns (process, port). Its
    bucket has no memory quota unless `extra` gives one (`--memory-quota`): a throughput figure
    should not depend on whether a million documents fit the default 100 MiB."""
    if "--memory-quota" not in extra:
        extra = ("--memory-quota", "unlimited", *extra)
    env = child_env()
    prof = ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE"]] if os.environ.get("BENCH_PROFILE") else []
    proc = subprocess.Popen([sys.executable, *prof, "-m", "dcpflow.cli", "server", "--port", "0",
                             "--data-dir", data_dir, "--vbuckets", str(vbuckets), *extra],
                            stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    match = re.search(r" port=(\d+)", line)  # the KV port, not mgmt_port=
    if not match:
        proc.kill()
        raise RuntimeError(f"dcpflow server did not start: {line!r}")
    return proc, int(match.group(1))


def stop(proc: subprocess.Popen, timeout: float = 120) -> None:
    """SIGTERM (a clean shutdown flushes), then SIGKILL if it does not exit within `timeout`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def build_data(data_dir: str, docs: int, value: bytes, vbuckets: int, datatype: int = 0) -> dict[int, int]:
    """N documents (`doc-000000000`...) through the engine, flushed; returns each vbucket's high seqno."""
    from dcpflow.engine import Bucket, VBucketState
    from dcpflow.protocol.keys import vbucket_for_key

    with Bucket("default", data_dir, vbuckets, synchronous="OFF", flush_batch_items=50_000) as bucket:
        for vb in range(vbuckets):
            bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
        vbs = [bucket.vbucket(vb) for vb in range(vbuckets)]
        for i in range(docs):
            key = b"doc-%09d" % i
            vbs[vbucket_for_key(key, vbuckets)].set(key, value, datatype=datatype)
            if i % 100_000 == 99_999:
                bucket.flush_all()
        bucket.flush_all()
        return {vb.id: vb.high_seqno for vb in vbs}


def next_frame(sock, decoder):
    """The next frame from a blocking socket (ConnectionError if the server closes it first)."""
    while True:
        frame = decoder.next_frame()
        if frame is not None:
            return frame
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        decoder.feed(chunk)


def call(sock, decoder, data: bytes):
    """Send one request on a blocking socket and return the next frame (its reply)."""
    sock.sendall(data)
    return next_frame(sock, decoder)


def login(port: int, agent: bytes, bucket: str = "default", features: tuple[int, ...] | None = None):
    """(socket, decoder): a blocking KV connection to 127.0.0.1:`port` after HELLO (`features`,
    default TCP_NODELAY), SCRAM-SHA512 as Administrator and SELECT_BUCKET `bucket`."""
    import socket

    from dcpflow.client.sasl import ScramClient
    from dcpflow.protocol import kv
    from dcpflow.protocol.frame import FrameDecoder, request
    from dcpflow.protocol.hello import Feature
    from dcpflow.protocol.opcodes import Opcode
    from dcpflow.protocol.status import Status

    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    d = FrameDecoder()
    wanted = (Feature.TCP_NODELAY,) if features is None else features
    call(sock, d, request(Opcode.HELLO, key=agent, value=b"".join(int(f).to_bytes(2, "big") for f in wanted)))
    scram = ScramClient("SCRAM-SHA512", "Administrator", "password")
    reply = call(sock, d, kv.SaslAuth(b"SCRAM-SHA512", scram.first()).encode())
    reply = call(sock, d, kv.sasl_step(b"SCRAM-SHA512", scram.final(reply.value)).encode())
    assert reply.status == Status.SUCCESS, reply
    assert call(sock, d, request(Opcode.SELECT_BUCKET, key=bucket.encode())).status == Status.SUCCESS
    return sock, d
