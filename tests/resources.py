"""Helpers of the resource-bound tests: a process's anonymous memory, and waiting for a condition."""

import time


def rss_anon(pid: int) -> int:
    """The process's anonymous resident memory in bytes (RssAnon: its heap, not mapped files)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def wait_for(fn, timeout: float = 60.0, what: str = "condition"):
    """fn()'s first truthy result, polled every 50 ms; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := fn()):
        assert time.monotonic() < deadline, f"{what} not met in time"
        time.sleep(0.05)
    return result
