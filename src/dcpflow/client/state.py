"""Persisting offsets: the `StateStore` interface and its default, an atomically replaced JSON file.

A store keeps one `ClientState`: the bucket it belongs to (name and UUID, so offsets are never
applied to another bucket, or to a bucket that was dropped and re-created) and one committed
`Offset` per vbucket (offsets.py: only ever a safe point). Anything with `load()` and `save()`
works as a store (a database row, an object-store key); `JsonFileStore` is the default.

File format (stable; readable by anything that reads JSON), one vbucket per line::

    {"format": 1, "bucket": "default", "bucket_uuid": "…", "num_vbuckets": 1024,
     "offsets": {
      "0": [123, 10],
      "1": [123, 30, 21, 30],
      …},
     "purge_seqnos": {"0": 0, …}}

An offset is in the compact form of offsets.py (the Spark source's too): [vbuuid, seqno] when its
snapshot is just that seqno, else [vbuuid, seqno, snapshot_start, snapshot_end]; `vbuuid` is the
unsigned 64-bit vbucket UUID as a JSON integer. Files written before hold each offset as an object
({"vbuuid": 123, "seqno": 10, "snapshot_start": 10, "snapshot_end": 10}); they are read as they are.
"""

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from .errors import StateStoreError
from .offsets import Offset, offsets_from_json, offsets_to_json

FORMAT = 1


@dataclass
class ClientState:
    bucket: str
    bucket_uuid: str | None = None
    num_vbuckets: int | None = None
    offsets: dict[int, Offset] = field(default_factory=dict)
    purge_seqnos: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": FORMAT, "bucket": self.bucket, "bucket_uuid": self.bucket_uuid,
                "num_vbuckets": self.num_vbuckets,
                "offsets": offsets_to_json(self.offsets),
                "purge_seqnos": {str(vb): s for vb, s in sorted(self.purge_seqnos.items()) if s}}

    @classmethod
    def from_json(cls, doc, where: str = "state") -> "ClientState":
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or "bucket" not in doc:
            raise StateStoreError(f"{where} is not a dcpflow offsets document (format {FORMAT})")
        try:
            offsets = offsets_from_json(doc.get("offsets", {}), "offsets: ")
            purge = {int(vb): int(s) for vb, s in doc.get("purge_seqnos", {}).items()}
        except (TypeError, ValueError) as e:
            raise StateStoreError(f"{where} has a bad offset: {e}") from None
        return cls(doc["bucket"], doc.get("bucket_uuid"), doc.get("num_vbuckets"), offsets, purge)

    def check_bucket(self, bucket: str, bucket_uuid: str | None, where: str = "state") -> None:
        """Refuse offsets that belong to another bucket (or an older bucket of the same name)."""
        if self.bucket != bucket:
            raise StateStoreError(f"{where} holds offsets of bucket {self.bucket!r}, not {bucket!r}")
        if self.bucket_uuid and bucket_uuid and self.bucket_uuid != bucket_uuid:
            raise StateStoreError(f"{where} holds offsets of an earlier bucket {bucket!r} (uuid {self.bucket_uuid}; "
                                  f"the bucket now has uuid {bucket_uuid}): it was dropped and re-created. Start "
                                  f"from the beginning, or remove the saved offsets")


def _dumps(doc: dict) -> str:
    """The document with one vbucket's offset per line (json.dumps' indent would spread every
    offset's numbers over lines of their own)."""
    lines = ",\n ".join(f"{json.dumps(k)}: {_dumps_offsets(v) if k == 'offsets' else json.dumps(v)}"
                         for k, v in doc.items())
    return "{" + lines + "}\n"


def _dumps_offsets(offsets: dict) -> str:
    if not offsets:
        return "{}"
    return "{\n  " + ",\n  ".join(f"{json.dumps(vb)}: {json.dumps(o)}" for vb, o in offsets.items()) + "}"


@runtime_checkable
class StateStore(Protocol):
    """Where offsets live between runs. `save` must be atomic: after a crash, `load` returns
    either the previous state or the new one, never a mix."""

    def load(self) -> ClientState | None: ...

    def save(self, state: ClientState) -> None: ...


class MemoryStore:
    """A StateStore in memory (tests, or an application that persists offsets itself)."""

    def __init__(self, state: ClientState | None = None):
        self.state = state
        self.saves = 0

    def load(self) -> ClientState | None:
        return None if self.state is None else ClientState.from_json(self.state.to_json())

    def save(self, state: ClientState) -> None:
        self.state = ClientState.from_json(state.to_json())
        self.saves += 1


class JsonFileStore:
    """The state in one JSON file, replaced atomically: written to a temporary file in the same
    directory, fsynced, renamed over the old one, and the directory fsynced, so a crash at any
    moment leaves the old or the new file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def load(self) -> ClientState | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateStoreError(f"cannot read offsets file {self.path}: {e.strerror}") from None
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise StateStoreError(f"offsets file {self.path} is not valid JSON ({e}); fix or remove it") from None
        return ClientState.from_json(doc, str(self.path))

    def save(self, state: ClientState) -> None:
        data = _dumps(state.to_json()).encode()
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise StateStoreError(f"cannot write offsets file {self.path}: {e.strerror or e}") from None

