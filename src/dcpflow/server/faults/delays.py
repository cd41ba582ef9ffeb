"""Delayed KV replies (fault injection): a rule holds every request of one opcode, or of all, for
some seconds before it runs, for a while or until cleared - what a slow server looks like to a
client (SDK timeouts, a DCP consumer whose stream requests or acks crawl).

A connection answers its requests in order (connection.py), so a held request holds the ones
pipelined behind it, and the DCP messages a stream would send once a held STREAM_REQ has run.
Only requests are held: the replies a DCP peer sends back (noops, acks of markers) are not.

Bounded by construction: a request is held MAX_SECONDS at most, a rule lasts MAX_DURATION at most,
there is one rule per opcode (a byte) plus one for all, and a connection holds one request at a
time - the requests behind it stay in its input buffer, which stops being read past
connection.MAX_PENDING_INPUT. So delays cost no more memory than a slow handler does. Clearing a
rule, or its duration running out, releases the requests it holds at once.
"""

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dcpflow.protocol.opcodes import Opcode

#: Seconds a request may be held at most.
MAX_SECONDS = 60.0
#: Seconds a rule may last at most (without a duration it lasts until cleared).
MAX_DURATION = 24 * 3600.0
#: The key of the rule that holds every opcode.
ALL = "all"


def opcode_label(opcode: int | str) -> str:
    """An opcode's name as the rules are listed (`GET`, `DCP_STREAM_REQ`, `0xfe`), or "all"."""
    if opcode == ALL:
        return ALL
    try:
        return Opcode(opcode).name
    except ValueError:
        return f"0x{opcode:02x}"


@dataclass(eq=False)
class Rule:
    opcode: int | str  # an opcode, or ALL
    seconds: float
    until: float | None  # time.monotonic() when it ends; None: until cleared
    released: asyncio.Event = field(default_factory=asyncio.Event)
    timer: asyncio.TimerHandle | None = None
    held: int = 0  # requests it holds right now
    total: int = 0  # requests it has held

    def describe(self) -> dict:
        remaining = None if self.until is None else max(0.0, round(self.until - time.monotonic(), 3))
        return {"opcode": opcode_label(self.opcode), "seconds": self.seconds, "remaining_seconds": remaining,
                "held_now": self.held, "held_total": self.total}


class Delays:
    """The server's delay rules. `changed()` is called whenever the set of delayed opcodes changes
    (the server refreshes its connections' fast paths: server/faults/injector.py)."""

    def __init__(self, changed: Callable[[], None]):
        self._rules: dict[int | str, Rule] = {}
        self._changed = changed
        #: Opcodes a connection must not run on its fast path (every opcode while ALL is set).
        self.held: frozenset[int] = frozenset()

    @property
    def active(self) -> bool:
        return bool(self._rules)

    def rules(self) -> list[Rule]:
        return sorted(self._rules.values(), key=lambda r: (r.opcode == ALL, r.opcode if r.opcode != ALL else 0))

    def rule_for(self, opcode: int) -> Rule | None:
        """The rule that holds a request of this opcode: its own, else the one for all."""
        rule = self._rules.get(opcode)
        return rule if rule is not None else self._rules.get(ALL)

    def add(self, opcode: int | str, seconds: float, duration: float | None = None) -> Rule:
        """Hold requests of `opcode` (or ALL) `seconds` each, for `duration` seconds or until
        cleared; replaces that opcode's rule (the requests the old one holds are released)."""
        if not 0 < seconds <= MAX_SECONDS:
            raise ValueError(f"a delay is more than 0 and at most {MAX_SECONDS:g} seconds")
        if duration is not None and not 0 < duration <= MAX_DURATION:
            raise ValueError(f"a duration is more than 0 and at most {MAX_DURATION:g} seconds")
        if opcode != ALL and not (isinstance(opcode, int) and 0 <= opcode <= 0xFF):
            raise ValueError(f"an opcode is a byte, not {opcode!r}")
        self._drop(opcode)
        rule = Rule(opcode, float(seconds), None if duration is None else time.monotonic() + duration)
        if duration is not None:
            rule.timer = asyncio.get_running_loop().call_later(duration, self._expire, rule)
        self._rules[opcode] = rule
        self._update()
        return rule

    def clear(self, opcode: int | str | None = None) -> list[Rule]:
        """Remove the rule of `opcode` (ALL: the rule for all), or every rule with None; returns
        the rules removed. What they hold runs at once."""
        keys = list(self._rules) if opcode is None else [opcode]
        removed = [r for r in (self._drop(k) for k in keys) if r is not None]
        if removed:
            self._update()
        return removed

    def _drop(self, opcode: int | str) -> Rule | None:
        rule = self._rules.pop(opcode, None)
        if rule is not None:
            if rule.timer is not None:
                rule.timer.cancel()
            rule.released.set()
        return rule

    def _expire(self, rule: Rule) -> None:
        if self._rules.get(rule.opcode) is rule:
            self._drop(rule.opcode)
            self._update()

    def _update(self) -> None:
        self.held = frozenset(range(256)) if ALL in self._rules else frozenset(
            k for k in self._rules if k != ALL)
        self._changed()

    async def hold(self, rule: Rule) -> None:
        """Wait out one request's delay (or until the rule is cleared)."""
        rule.held += 1
        rule.total += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rule.released.wait(), rule.seconds)
        finally:
            rule.held -= 1
