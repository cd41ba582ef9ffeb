"""Commands the tests start, each in a process group of its own that is ended whole.

A command under test starts processes of its own: `dcpflow demo` and `dcpflow pipeline` a server
and a JVM, a bench script its servers, `dcpflow cluster up` its nodes, a nested pytest its
workers. `subprocess.run(..., timeout=...)` kills only the process it started, so a command that
timed out (on a busy machine, or hung) left the rest running: servers holding ports, memory and
CPU for the rest of the suite, clients reconnecting to ports the OS hands out again. Here the
command runs in a new session and its whole group is killed when it ends, however it ends."""

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path


def process_groups_alive(pgids: list[int]) -> list[int]:
    """PIDs of live (not zombie) processes in these process groups."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) in pgids:
            alive.append(int(entry.name))
    return alive


def stop_groups(procs: list[subprocess.Popen], timeout: float = 30) -> None:
    """SIGTERM every process group, then SIGKILL what is left; wait until none of them lives."""
    pgids = [p.pid for p in procs]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in pgids:
            with contextlib.suppress(ProcessLookupError):  # the group has ended already
                os.killpg(pgid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in procs:
                p.poll()  # reap our direct children
            if not process_groups_alive(pgids):
                return
            time.sleep(0.1)
    raise RuntimeError(f"processes still alive after SIGKILL: {process_groups_alive(pgids)}")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`'s process group (started with start_new_session) and reap `proc`. Only while
    `proc` is not reaped is the group's id surely ours (pid_max may be 32768 and ids come round):
    a `proc` reaped already (waited for by the test) is left alone with what it started."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)


def popen(args, **kwargs) -> subprocess.Popen:
    """subprocess.Popen in a session (and process group) of its own: end it with kill_group."""
    return subprocess.Popen(args, start_new_session=True, **kwargs)


def _exited(proc: subprocess.Popen) -> bool:
    """Whether `proc` has exited, without reaping it (its process group's id stays ours)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def run_group(args, *, timeout: float, input=None, capture_output: bool = False, check: bool = False,
        **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run, in a process group of its own that is killed whole once the command has
    exited, timed out or the wait was interrupted: nothing it started outlives it."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    proc = popen(args, **kwargs)
    results: dict[str, object] = {}

    def read(name: str) -> None:
        results[name] = getattr(proc, name).read()

    def write() -> None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(input)
            proc.stdin.close()

    threads = [threading.Thread(target=read, args=(name,), daemon=True)
               for name in ("stdout", "stderr") if getattr(proc, name) is not None]
    if input is not None:
        threads.append(threading.Thread(target=write, daemon=True))
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while not _exited(proc):
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # `proc` is not reaped yet: the group's id is still ours
        proc.wait()
    for t in threads:
        t.join(30)  # the group is gone: its pipes are at their end
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()
    out, err = results.get("stdout"), results.get("stderr")
    if timed_out:
        raise subprocess.TimeoutExpired(proc.args, timeout, out, err)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def first_line(proc: subprocess.Popen, timeout: float = 300) -> str:
    """The first line `proc` writes to its stdout (a server's ready line), or "" if none comes
    within `timeout` (a bound on a failure: a busy machine may need much of it)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else ""


def stop(proc: subprocess.Popen, timeout: float = 60) -> int:
    """SIGTERM `proc` and wait for it; one that has not stopped within `timeout` is killed with
    its process group and the test fails (a clean stop is part of what the tests check)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise AssertionError(f"{proc.args} did not stop within {timeout} s of SIGTERM: killed") from None
    return proc.returncode
