"""The audit trail: every security event of both ports - failed logins, refused commands and
requests, connections closed for invalid input - and every change to buckets, scopes,
collections, users and roles.

Couchbase's audit daemon is the model (https://github.com/couchbase/kv_engine/tree/master/auditd):
each event is one JSON object with Couchbase's id, name and description, a timestamp, the user
(`real_userid`: its domain and name) and both ends of the connection (`remote` and `local`, each
`{"ip", "port"}`), plus the event's own fields. The ids are memcached's for the KV port
(kv_engine's etc/memcached_descriptor.json: 20481 authentication failed, 20483 invalid packet,
20484 command access failure) and ns_server's for the management port
(https://github.com/couchbase/ns_server/blob/master/etc/audit_descriptor.json: 8193 login
failure, 8264 authentication failure - a 401 -, 8275 access forbidden - a 403 -, 8201-8204
buckets, 8259-8263 and 8270 scopes, collections and manifests, 8232 set user, 8194 delete user). dcpflow's own event,
"privileges changed" (an authenticated connection authenticated again as another user), has no id.

Where events go:

* with `path` (`--audit-log FILE`), the file, as JSON lines: **every** event, in full - no rate
  limit, no summaries, so a burst of decoy events can never hide the one that matters. If the file
  cannot be written (a full disk, no descriptors), the server says so once at ERROR, keeps
  serving, counts the events lost (`lost`, the /metrics counter kv_audit_dropped_events_total, as
  memcached's audit_dropped_events), retries at most once per interval, and once it can write
  again records how many were lost;
* the `dcpflow.audit` logger at WARNING - what `dcpflow server` prints by default - one line per
  event (`audit {...}`), rate-limited per event name (boundedlog.py): a client failing to log in a
  thousand times a second makes a few lines and a count there, never a flood.

`counts` has every event by name (the /metrics counter kv_audit_events_total).
"""

import contextlib
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


# the KV port: memcached's events
AUTHENTICATION_FAILED = AuditEvent(20481, "authentication failed", "Authentication to the cluster failed")
INVALID_PACKET = AuditEvent(20483, "invalid packet", "Rejected an invalid packet")
COMMAND_ACCESS_FAILURE = AuditEvent(20484, "command access failure", "Access to command is not allowed")
PRIVILEGES_CHANGED = AuditEvent(None, "privileges changed",
                                "An authenticated connection authenticated again as another user")
# the management port: ns_server's events
LOGIN_FAILURE = AuditEvent(8193, "login failure", "Unsuccessful attempt to login to couchbase cluster")
HTTP_AUTHENTICATION_FAILURE = AuditEvent(8264, "authentication failure", "Authentication failed")
ACCESS_FORBIDDEN = AuditEvent(8275, "access forbidden", "Access to the requested resource was forbidden")
CREATE_BUCKET = AuditEvent(8201, "create bucket", "Bucket was created")
MODIFY_BUCKET = AuditEvent(8202, "modify bucket", "Bucket was modified")
DELETE_BUCKET = AuditEvent(8203, "delete bucket", "Bucket was deleted")
FLUSH_BUCKET = AuditEvent(8204, "flush bucket", "Bucket was flushed")
CREATE_SCOPE = AuditEvent(8259, "create scope", "Scope was created")
DROP_SCOPE = AuditEvent(8260, "drop scope", "Scope was dropped")
CREATE_COLLECTION = AuditEvent(8261, "create collection", "Collection was created")
DROP_COLLECTION = AuditEvent(8262, "drop collection", "Collection was dropped")
MODIFY_COLLECTION = AuditEvent(8270, "modify collection", "Collection was modified")
SET_MANIFEST = AuditEvent(8263, "set manifest", "Collections manifest was set")
SET_USER = AuditEvent(8232, "set user", "User was added or updated")
DELETE_USER = AuditEvent(8194, "delete user", "User was deleted")
EVENTS = (AUTHENTICATION_FAILED, INVALID_PACKET, COMMAND_ACCESS_FAILURE, PRIVILEGES_CHANGED, LOGIN_FAILURE,
          HTTP_AUTHENTICATION_FAILURE, ACCESS_FORBIDDEN, CREATE_BUCKET, MODIFY_BUCKET, DELETE_BUCKET, FLUSH_BUCKET,
          CREATE_SCOPE, DROP_SCOPE, CREATE_COLLECTION, DROP_COLLECTION, MODIFY_COLLECTION, SET_MANIFEST, SET_USER,
          DELETE_USER)
#: dcpflow's own record, in the file, of events an unwritable file lost.
EVENTS_LOST = AuditEvent(None, "audit events lost", "Audit events that could not be written to the audit file")


def endpoint(address) -> dict:
    """`{"ip", "port"}` of a socket address: a (host, port, ...) tuple or "host:port" text."""
    if isinstance(address, tuple) and len(address) >= 2:
        return {"ip": str(address[0]), "port": address[1]}
    host, sep, port = str(address).rpartition(":")
    if sep and port.isdigit():
        return {"ip": host.strip("[]"), "port": int(port)}
    return {"ip": str(address), "port": 0}


class Audit:
    """See the module docstring."""

    def __init__(self, path: str | Path | None = None, *, interval: float = INTERVAL, samples: int = SAMPLES,
                 clock: Callable[[], float] = time.monotonic):
        self.path = Path(path) if path is not None else None
        self._file = None
        self._clock = clock
        self.interval = interval
        self._failed_at: float | None = None  # when the file last failed (None: it works)
        self.lost = 0  # events the file did not get, since the server started
        self._lost_since_failure = 0
        self.counts: Counter[str] = Counter()
        self.limiter = RateLimiter(self._summary, interval=interval, samples=samples, clock=clock)

    def record(self, event: AuditEvent, *, remote, local, user: str | None, domain: str = "local",
               **fields) -> None:
        """One event: `remote` and `local` are the client's and the server's addresses, `user`
        whoever the connection is (or claimed to be; None: no user at all); `fields` are the
        event's own (reason, bucket_name...)."""
        self.counts[event.name] += 1
        doc: dict = {"id": event.id, "name": event.name, "description": event.description, "timestamp": _now(),
                     "remote": endpoint(remote), "local": endpoint(local)}
        if user is not None:
            doc["real_userid"] = {"domain": domain, "user": _field(user)}
        doc.update({k: _field(v) if isinstance(v, str) else v for k, v in fields.items()})
        line = json.dumps(doc, separators=(",", ":"), ensure_ascii=True)
        self._to_file(line)
        if self.limiter.allow(event.name):
            log.warning("audit %s", line)

    def open(self) -> None:
        """Open the file now (the server starts with it: its descriptor is taken before clients
        can take them all); a failure is said and counted as any other."""
        self._to_file(None)

    def tick(self) -> None:
        self.limiter.tick()
        if self._failed_at is not None and self._clock() - self._failed_at >= self.interval:
            self._to_file(None)  # try the file again, even with no new event

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def _summary(self, name: str, count: int, seconds: float) -> None:
        log.warning("audit: %d more %r events in the last %.0f s are not shown here (at most %d per %.0f s "
                    "are)%s", count, name, seconds, self.limiter.samples, self.limiter.interval,
                    "; the audit file has every one" if self.path is not None else "")

    def _to_file(self, line: str | None) -> None:
        """Append `line` (None: only open the file, or retry one that failed) - every event, or
        count it lost."""
        if self.path is None:
            return
        if self._failed_at is not None and self._clock() - self._failed_at < self.interval:
            if line is not None:
                self._lost(1)
            return
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="ascii", buffering=1)  # noqa: SIM115 - kept open
            if self._failed_at is not None:
                lost, self._failed_at, self._lost_since_failure = self._lost_since_failure, None, 0
                self._file.write(json.dumps({"id": EVENTS_LOST.id, "name": EVENTS_LOST.name,
                                             "description": EVENTS_LOST.description, "timestamp": _now(),
                                             "count": lost}, separators=(",", ":")) + "\n")
                log.error("the audit log %s can be written again: %d audit events were lost", self.path, lost)
            if line is not None:
                self._file.write(line + "\n")
        except OSError as e:
            self.close()
            first = self._failed_at is None
            self._failed_at = self._clock()
            if line is not None:
                self._lost(1)
            if first:
                log.error("CANNOT WRITE THE AUDIT LOG %s (%s): the server keeps serving; audit events are "
                          "counted as lost (kv_audit_dropped_events_total) and the file is retried every %.0f s",
                          self.path, e, self.interval)

    def _lost(self, n: int) -> None:
        self.lost += n
        self._lost_since_failure += n


def _field(text: str) -> str:
    return printable(text, MAX_FIELD_CHARS)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
