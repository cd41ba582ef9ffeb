"""The rate limiter behind every per-request warning (server/boundedlog.py), on an injected clock."""

import logging

from dcpflow.server.boundedlog import BoundedLog, RateLimiter, printable


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_kind_passes_its_samples_per_interval_and_reports_the_rest():
    clock, reports = Clock(), []
    limiter = RateLimiter(lambda kind, n, s: reports.append((kind, n, s)), interval=10, samples=3, clock=clock)
    assert [limiter.allow("a") for _ in range(5)] == [True, True, True, False, False]
    assert limiter.allow("b")  # another kind has its own budget
    clock.now += 9.9
    assert not limiter.allow("a") and reports == []
    clock.now += 0.1  # the interval is over: the next event reports the three left out, and passes
    assert limiter.allow("a")
    assert reports == [("a", 3, 10.0)]
    assert limiter.seen["a"] == 7 and limiter.suppressed["a"] == 3


def test_tick_reports_an_interval_that_no_later_event_closes():
    clock, reports = Clock(), []
    limiter = RateLimiter(lambda kind, n, s: reports.append((kind, n)), interval=10, samples=1, clock=clock)
    for _ in range(4):
        limiter.allow("a")
    limiter.tick()
    assert reports == []
    clock.now += 10
    limiter.tick()
    assert reports == [("a", 3)]
    clock.now += 10
    limiter.tick()
    limiter.tick()
    assert reports == [("a", 3)] and "a" not in limiter._windows  # an idle kind is forgotten


def test_printable_escapes_control_characters_and_cuts_long_text():
    assert printable("a\nb\x1b[31m\x7f") == "a\\nb\\x1b[31m\\x7f"
    assert printable("line 1\nline 2", keep_newlines=True) == "line 1\nline 2"
    assert printable("x" * 30, 10) == "x" * 10 + "... (20 more characters)"


def test_a_bounded_log_writes_samples_then_one_summary(caplog):
    clock = Clock()
    bounded = BoundedLog(logging.getLogger("dcpflow.test.bounded"), interval=10, samples=2, max_chars=50,
                         clock=clock)
    with caplog.at_level(logging.WARNING, logger="dcpflow.test.bounded"):
        for i in range(1000):
            bounded.warning("bad-input", "closing %s: %s", f"peer{i}", "z" * 500)
        clock.now += 10
        bounded.tick()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("closing peer0: zzz") and lines[0].endswith("(465 more characters)")
    assert lines[2] == "998 more bad-input events in the last 10 s were not logged (at most 2 per 10 s are)"
