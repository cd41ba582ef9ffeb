"""Password guessing, slowed down: failed logins counted per source address and per user, and a
temporary refusal that grows with them. The KV port (SASL) and the management port (HTTP basic
auth, the web page's login form) share one LoginThrottle per server.

Only a *failed check of credentials* counts (a wrong password, an unknown user): not a malformed
exchange, not a mechanism the connection may not use, never a successful login. After FREE_FAILURES
failures, each further failure locks its key for FIRST_LOCKOUT seconds, doubling with every failure
up to 64 times that (FIRST_LOCKOUT x 2^6). While a key is locked, an attempt is refused at once,
without looking at the password (so a refused guess tells the guesser nothing): AUTH_ERROR on the
KV port, 429 with Retry-After on HTTP, and an audit event either way. With the defaults, 20 wrong
passwords from one address take at least 1+2+4+8+16+32+9x64 = 639 seconds, where they took a
tenth of a second.

The keys:

* a source address (the IP, whatever the port) - one host guessing, whatever user names it tries;
* a user name - many hosts guessing one user's password. This lock applies only to addresses that
  have themselves failed as that user since they last logged in as it: an address with no failure
  for the user - the administrator's own desk - is never held up by someone else's guessing, and
  a successful login forgets that address's failures for that user (and for no other: logging in
  as one's own account does not reset the count of guesses at another's).

Nothing here grows with the clients: at most MAX_ENTRIES (address, user) pairs are remembered (the
longest-unused are forgotten first), and a key forgets its failures FORGET_AFTER seconds after its
last one. Sans-I/O: the clock is injected; the server asks `check` before it verifies credentials
and reports `failed` / `succeeded` after.
"""

import time
from collections import OrderedDict
from collections.abc import Callable

#: Failures a key may have before it is locked.
FREE_FAILURES = 5
#: Seconds of the first lock; each further failure doubles it, up to 2^MAX_DOUBLINGS times.
FIRST_LOCKOUT = 1.0
MAX_DOUBLINGS = 6
#: Seconds after its last failure that a key's failures are forgotten.
FORGET_AFTER = 900.0
#: (address, user) pairs remembered at most.
MAX_ENTRIES = 4096


class _Key:
    __slots__ = ("failures", "last", "locked_until")

    def __init__(self):
        self.failures = 0
        self.last = 0.0
        self.locked_until = 0.0


class LoginThrottle:
    """See the module docstring. `free` = 0 turns throttling off."""

    def __init__(self, free: int = FREE_FAILURES, lockout: float = FIRST_LOCKOUT, *,
                 clock: Callable[[], float] = time.monotonic, forget: float = FORGET_AFTER,
                 max_entries: int = MAX_ENTRIES):
        self.free = free
        self.first_lockout = lockout
        self.forget = forget
        self.max_entries = max_entries
        self._clock = clock
        self._pairs: OrderedDict[tuple[str, str], list] = OrderedDict()  # -> [failures, last failure]
        self._addresses: dict[str, _Key] = {}
        self._users: dict[str, _Key] = {}
        self.refused = 0  # attempts refused while locked

    @property
    def enabled(self) -> bool:
        return self.free > 0

    def lockout(self, failures: int) -> float:
        """Seconds a key is locked after its `failures`-th failure (0 within the free ones)."""
        if failures < self.free:
            return 0.0
        return self.first_lockout * 2 ** min(failures - self.free, MAX_DOUBLINGS)

    def check(self, address: str, user: str) -> float:
        """Seconds before an attempt from `address` as `user` may be checked (0: now)."""
        if not self.enabled:
            return 0.0
        now = self._clock()
        self._expire(now)
        wait = 0.0
        key = self._addresses.get(address)
        if key is not None:
            wait = key.locked_until - now
        key = self._users.get(user)
        if key is not None and (address, user) in self._pairs:
            wait = max(wait, key.locked_until - now)
        if wait > 0:
            self.refused += 1
            return wait
        return 0.0

    def failed(self, address: str, user: str) -> None:
        if not self.enabled:
            return
        now = self._clock()
        pair = self._pairs.get((address, user))
        if pair is None:
            pair = self._pairs[(address, user)] = [0, now]
        else:
            self._pairs.move_to_end((address, user))
        pair[0] += 1
        pair[1] = now
        for table, name in ((self._addresses, address), (self._users, user)):
            key = table.get(name)
            if key is None:
                key = table[name] = _Key()
            key.failures += 1
            key.last = now
            if key.failures >= self.free:
                key.locked_until = max(key.locked_until, now + self.lockout(key.failures))
        while len(self._pairs) > self.max_entries:
            self._drop(*self._pairs.popitem(last=False))

    def succeeded(self, address: str, user: str) -> None:
        """`address` proved it knows `user`'s password: its failures as `user` are forgotten."""
        pair = self._pairs.pop((address, user), None)
        if pair is not None:
            self._drop((address, user), pair)

    def _drop(self, pair_key: tuple[str, str], pair: list) -> None:
        address, user = pair_key
        for table, name in ((self._addresses, address), (self._users, user)):
            key = table.get(name)
            if key is not None:
                key.failures -= pair[0]
                if key.failures <= 0 and key.locked_until <= self._clock():
                    del table[name]

    def _expire(self, now: float) -> None:
        while self._pairs:
            pair_key, pair = next(iter(self._pairs.items()))
            if now - pair[1] < self.forget:
                break
            del self._pairs[pair_key]
            self._drop(pair_key, pair)
        for table in (self._addresses, self._users):
            if len(table) > 2 * len(self._pairs) + 64:  # keys whose pairs are gone and whose lock expired
                for name in [n for n, k in table.items() if k.failures <= 0 and k.locked_until <= now]:
                    del table[name]
