"""Warnings about single requests, with a bound on how much log they can make.

A client decides how often the server has a reason to warn about it: a stream of malformed frames,
failed logins or refused commands would otherwise write one line each, as fast as the client can
send them (and nothing stops an unauthenticated client from sending them). So every per-request
warning goes through a `BoundedLog`: each *kind* of event (a fixed set, named in the code) logs
its first `samples` occurrences of every `interval` in full, counts the rest, and once the interval
is over says in one line how many it left out. Each line is cut to `max_chars`, with control
characters escaped (peer names, user names and reasons can come from the client). The log grows
at most kinds x (samples + 1) lines per interval, whatever the clients do.

`RateLimiter` is the counting alone (the audit trail uses it for its own outputs, audit.py).
Sans-I/O: the clock is injected, and the owner calls `tick()` now and then (the server does every
second) so an interval's summary is written even when no later event of that kind comes.
"""

import logging
import time
from collections import Counter
from collections.abc import Callable

#: Seconds of one interval, the samples written in full per kind and interval, and the longest line.
INTERVAL = 10.0
SAMPLES = 5
MAX_CHARS = 1000
_ESCAPES = {c: f"\\x{c:02x}" for c in range(32) if c != 10} | {0x7F: "\\x7f"}


def printable(text: str, max_chars: int = MAX_CHARS, *, keep_newlines: bool = False) -> str:
    """`text` safe for one log record: control characters escaped (newlines too, unless
    `keep_newlines`: a traceback keeps its lines), cut to `max_chars` with the count of the rest."""
    text = text.translate(_ESCAPES if keep_newlines else {**_ESCAPES, 10: "\\n"})
    if len(text) > max_chars:
        text = f"{text[:max_chars]}... ({len(text) - max_chars} more characters)"
    return text


class RateLimiter:
    """Per kind: the first `samples` events of each `interval` pass, the rest are counted and
    reported through `report(kind, count, seconds)` once their interval is over."""

    def __init__(self, report: Callable[[str, int, float], None], *, interval: float = INTERVAL,
                 samples: int = SAMPLES, clock: Callable[[], float] = time.monotonic,
                 kind_samples: dict[str, int] | None = None):
        self._report = report
        self.interval = interval
        self.samples = samples
        self.kind_samples = dict(kind_samples or {})  # kinds with their own number of samples
        self._clock = clock
        self._windows: dict[str, list] = {}  # kind -> [start, passed, suppressed]
        self.seen: Counter[str] = Counter()  # events per kind, passed or not
        self.suppressed: Counter[str] = Counter()

    def allow(self, kind: str) -> bool:
        """Count an event of `kind`; True if it is one of its interval's samples."""
        self.seen[kind] += 1
        now = self._clock()
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = [now, 0, 0]
        elif now - window[0] >= self.interval:
            self._close(kind, window, now)
        if window[1] < self.kind_samples.get(kind, self.samples):
            window[1] += 1
            return True
        window[2] += 1
        self.suppressed[kind] += 1
        return False

    def tick(self) -> None:
        """Report the intervals that are over (and forget idle kinds)."""
        now = self._clock()
        for kind, window in list(self._windows.items()):
            if now - window[0] >= self.interval:
                if window[2] == 0 and window[1] == 0:
                    del self._windows[kind]
                else:
                    self._close(kind, window, now)

    def _close(self, kind: str, window: list, now: float) -> None:
        if window[2]:
            self._report(kind, window[2], now - window[0])
        window[0], window[1], window[2] = now, 0, 0


class BoundedLog:
    """A logger's per-request warnings under a RateLimiter (module docstring)."""

    def __init__(self, logger: logging.Logger, *, interval: float = INTERVAL, samples: int = SAMPLES,
                 max_chars: int = MAX_CHARS, clock: Callable[[], float] = time.monotonic,
                 kind_samples: dict[str, int] | None = None):
        self.logger = logger
        self.max_chars = max_chars
        self._levels: dict[str, int] = {}
        self.limiter = RateLimiter(self._summary, interval=interval, samples=samples, clock=clock,
                                   kind_samples=kind_samples)

    def warning(self, kind: str, msg: str, *args) -> bool:
        return self.log(logging.WARNING, kind, msg, *args)

    def error(self, kind: str, msg: str, *args, keep_newlines: bool = False) -> bool:
        return self.log(logging.ERROR, kind, msg, *args, keep_newlines=keep_newlines)

    def log(self, level: int, kind: str, msg: str, *args, keep_newlines: bool = False) -> bool:
        """Log `msg % args` as one of `kind`'s samples, or count it; True if it was written."""
        if not self.logger.isEnabledFor(level):
            self.limiter.seen[kind] += 1
            return False
        self._levels[kind] = level
        if not self.limiter.allow(kind):
            return False
        text = msg % args if args else msg
        limit = self.max_chars * 4 if keep_newlines else self.max_chars
        self.logger.log(level, "%s", printable(text, limit, keep_newlines=keep_newlines))
        return True

    def tick(self) -> None:
        self.limiter.tick()

    def _summary(self, kind: str, count: int, seconds: float) -> None:
        self.logger.log(self._levels.get(kind, logging.WARNING), "%d more %s events in the last %.0f s were not "
                        "logged (at most %d per %.0f s are)", count, kind, seconds,
                        self.limiter.kind_samples.get(kind, self.limiter.samples), self.limiter.interval)
