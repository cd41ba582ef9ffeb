"""The audit trail of refusals: failed logins, refused commands, connections closed for invalid
input, and connections whose privileges changed under them.

Couchbase's memcached writes these as audit events, each a JSON object with an id, a name, a
timestamp, the user (`real_userid`: source and user) and the addresses of both ends
(https://github.com/couchbase/kv_engine/blob/master/etc/memcached_descriptor.json): 20481
"authentication failed" (with a reason), 20483 "invalid packet", 20484 "command access failure"
(with the bucket). dcpflow writes the same objects, plus one of its own without a Couchbase id,
"privileges changed", when an authenticated connection authenticates again as another user (its
privileges are replaced; DCP streams that lose theirs end).

Where: the `dcpflow.audit` logger at WARNING - what `dcpflow server` prints by default - one line
per event (`audit {...}`), and with `path` (`--audit-log FILE`) also a file of JSON lines. Both
are rate-limited per event (boundedlog.py): a client that fails to log in a thousand times a
second makes a few lines and a count, never a flood. `counts` has every event, written or not
(the /metrics refusal counters).
"""

import datetime
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from .boundedlog import INTERVAL, SAMPLES, RateLimiter, printable

log = logging.getLogger("dcpflow.audit")

#: The longest user name, reason or command text an event carries (all can come from the client).
MAX_FIELD_CHARS = 256


class AuditEvent(NamedTuple):
    id: int | None  # Couchbase's id; None for dcpflow's own
    name: str
    description: str


AUTHENTICATION_FAILED = AuditEvent(20481, "authentication failed", "Authentication to the cluster failed")
INVALID_PACKET = AuditEvent(20483, "invalid packet", "Rejected an invalid packet")
COMMAND_ACCESS_FAILURE = AuditEvent(20484, "command access failure", "Access to command is not allowed")
PRIVILEGES_CHANGED = AuditEvent(None, "privileges changed",
                                "An authenticated connection authenticated again as another user")
EVENTS = (AUTHENTICATION_FAILED, INVALID_PACKET, COMMAND_ACCESS_FAILURE, PRIVILEGES_CHANGED)


class Audit:
    """See the module docstring."""

    def __init__(self, path: str | Path | None = None, *, interval: float = INTERVAL, samples: int = SAMPLES,
                 clock: Callable[[], float] = time.monotonic):
        self.path = Path(path) if path is not None else None
        self._file = None
        self._file_failed = False
        self.counts: Counter[str] = Counter()
        self.limiter = RateLimiter(self._summary, interval=interval, samples=samples, clock=clock)

    def record(self, event: AuditEvent, *, peer: str, sock: str, user: str | None, source: str = "local",
               **fields) -> None:
        """One event: `peer` and `sock` are the client's and the server's addresses, `user` whoever
        the connection is (or claimed to be); `fields` are the event's own (reason, bucket...)."""
        self.counts[event.name] += 1
        if not self.limiter.allow(event.name):
            return
        doc: dict = {"id": event.id, "name": event.name, "description": event.description,
                     "timestamp": _now(), "real_userid": {"source": source, "user": _field(user or "")},
                     "peername": peer, "sockname": sock}
        doc.update({k: _field(v) if isinstance(v, str) else v for k, v in fields.items()})
        self._write(doc)

    def tick(self) -> None:
        self.limiter.tick()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _summary(self, name: str, count: int, seconds: float) -> None:
        self._write({"id": None, "name": "events not recorded", "description": "Audit events over the rate limit",
                     "timestamp": _now(), "event": name, "count": count, "seconds": round(seconds, 1)})

    def _write(self, doc: dict) -> None:
        line = json.dumps(doc, separators=(",", ":"), ensure_ascii=True)
        log.warning("audit %s", line)
        if self.path is None or self._file_failed:
            return
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="ascii", buffering=1)  # noqa: SIM115 - kept open
            self._file.write(line + "\n")
        except OSError as e:
            self._file_failed = True
            log.error("cannot write the audit log %s (%s): audit events go to this log only", self.path, e)


def _field(text: str) -> str:
    return printable(text, MAX_FIELD_CHARS)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
