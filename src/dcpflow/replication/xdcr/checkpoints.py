"""Where a cross-cluster replication stands, kept so that a restart of either side resends nothing
that reached the target, and resends everything that may not have.

A checkpoint is a *generation*: taken at one moment between two batches, it holds, per source
vbucket, the stream position of the last change whose write the target acknowledged (vbucket
UUID, seqno and the snapshot it came in: exactly what a stream request needs to resume, as
https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/stream-request.md
describes), and per target vbucket the target's history branch and the highest seqno our writes
were given there (from the replies' mutation tokens). goxdcr keeps the same pair per vbucket
(its "checkpoint record": source seqno, snapshot, failover UUID, and the target's vbuuid and
seqno).

Why the target half: a target that crashes loses its unpersisted writes, and comes back on a
new branch of its failover log. A generation whose target seqnos all lie on what the target
still has is a safe place to resume from; a newer one is not. `Generations.safe_for` finds the
newest safe one (`target_survives` applies the failover-log rule); the oldest of all is "from
the beginning", which is always safe. Going back there for some vbuckets rewrites what the newer
generations say of those (`Generations.forget`) and keeps the rest. The file keeps the last `KEEP` generations.

A generation also names the broken mappings of its moment: collections whose source documents
were skipped because the target lacked them, still to be backfilled once it has them (namespaces.py).

The file is JSON, replaced atomically (write, fsync, rename), so a kill -9 leaves the previous
generation or the new one, never half of one.
"""

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

from dcpflow.client.offsets import Offset, offsets_from_json, offsets_to_json

FORMAT = 1
KEEP = 16


class CheckpointError(Exception):
    """The state directory holds checkpoints of another replication, or unreadable ones."""


class Generation(NamedTuple):
    source: dict[int, Offset]  # source vbucket -> stream position
    target: dict[int, tuple[int, int]]  # target vbucket -> (vbuuid, highest seqno of our writes)
    #: (scope, collection) whose source documents were skipped before this point because the
    #: target lacked the collection, and are still to be sent once it has it (a backfill)
    broken: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict:
        doc = {"source": offsets_to_json(self.source),
               "target": {str(vb): [u, s] for vb, (u, s) in sorted(self.target.items())}}
        if self.broken:
            doc["broken"] = [list(names) for names in self.broken]
        return doc

    @classmethod
    def from_json(cls, doc: dict, where: str) -> "Generation":
        try:
            target = {int(vb): (int(u), int(s)) for vb, (u, s) in doc.get("target", {}).items()}
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: target positions are not [vbuuid, seqno] pairs: {e}") from None
        broken = doc.get("broken", [])
        if not isinstance(broken, list) or not all(isinstance(n, list) and len(n) == 2 and
                                                   all(isinstance(x, str) for x in n) for n in broken):
            raise CheckpointError(f"{where}: broken is not a list of [scope, collection] names: {broken!r}")
        return cls(offsets_from_json(doc.get("source", {}), where + ": source "), target,
                   tuple(tuple(n) for n in broken))


BEGINNING = Generation({}, {})


def target_survives(position: tuple[int, int], failover_log: list[tuple[int, int]]) -> bool:
    """Does the target still hold a write made at (vbuuid, seqno), given its failover log (newest
    entry first)? Yes if the write's branch is the current one, or if a later branch started at or
    after that seqno (everything up to a branch's start was kept when it began); no if the branch
    is unknown (a failover dropped it) or ended below the seqno (the write was lost with the
    unpersisted tail)."""
    vbuuid, seqno = position
    for i, (u, _start) in enumerate(failover_log):
        if u == vbuuid:
            return i == 0 or seqno <= failover_log[i - 1][1]
    return False


class Generations:
    """The generations of one replication, newest first, with the identities they belong to."""

    def __init__(self, identity: dict, generations: list[Generation]):
        self.identity = identity
        self.items = generations

    @property
    def newest(self) -> Generation:
        return self.items[0] if self.items else BEGINNING

    def add(self, generation: Generation) -> None:
        self.items.insert(0, generation)
        del self.items[KEEP:]

    def safe_for(self, lost: dict[int, list[tuple[int, int]]]) -> Generation:
        """The newest generation whose writes to every target vbucket in `lost` ({target vbucket:
        its failover log}) are still on the target; BEGINNING if none is."""
        for g in self.items:
            if all(tvb not in g.target or target_survives(g.target[tvb], log) for tvb, log in lost.items()):
                return g
        return BEGINNING

    def forget(self, safe: Generation, source_vbuckets, target_vbuckets) -> None:
        """What the generations after `safe` say of these vbuckets was lost (the target lost our
        writes there, the source positions go back to `safe`'s): from now on each says what `safe`
        says of them, and keeps what it says of the others. Dropping those generations instead
        would leave the other vbuckets' records at `safe`'s, lower than what was written since:
        a loss of those writes found later (on a target restart, the first reply names only some
        vbuckets) would then look survived, and they would never be sent again."""
        def like_safe(table: dict, safe_table: dict, vbuckets) -> dict:
            table = dict(table)
            for vb in vbuckets:
                if vb in safe_table:
                    table[vb] = safe_table[vb]
                else:
                    table.pop(vb, None)
            return table

        for i, g in enumerate(self.items):
            if g is safe:
                return
            broken = tuple(sorted(set(g.broken) | set(safe.broken)))  # backfills done since may be lost too
            self.items[i] = Generation(like_safe(g.source, safe.source, source_vbuckets),
                                       like_safe(g.target, safe.target, target_vbuckets), broken)


class CheckpointStore:
    """`checkpoints.json` in the state directory. `identity` names the replication (source and
    target bucket names and UUIDs): checkpoints of another pair, or of a bucket that was dropped
    and created again under the same name, are refused rather than resumed from."""

    def __init__(self, state_dir: str | os.PathLike):
        self.dir = Path(state_dir)
        self.path = self.dir / "checkpoints.json"

    def load(self, identity: dict) -> Generations:
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return Generations(identity, [])
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise CheckpointError(f"{self.path} is not JSON ({e}); move it away to start the replication over") \
                from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CheckpointError(f"{self.path} has format {doc.get('format') if isinstance(doc, dict) else doc!r}, "
                                  f"this version reads {FORMAT}")
        saved = doc.get("identity", {})
        for field, value in identity.items():
            if saved.get(field) != value:
                raise CheckpointError(f"{self.path} belongs to another replication: its {field} is "
                                      f"{saved.get(field)!r}, this one's is {value!r}; use another --state-dir, or "
                                      f"remove it to start over (everything is sent again)")
        gens = [Generation.from_json(g, f"{self.path} generation {i}")
                for i, g in enumerate(doc.get("generations", []))]
        return Generations(identity, gens)

    def save(self, generations: Generations) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "identity": generations.identity,
               "generations": [g.to_json() for g in generations.items]}
        write_atomically(self.path, json.dumps(doc, separators=(",", ":")))


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
