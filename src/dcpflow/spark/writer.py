"""`df.write.format("dcp")`: rows into a bucket, by Spark tasks in parallel (each task opens its own
client and pipelines its rows per target node, dcpflow.client.with_meta).

Two modes:

* plain (default): a row is an upsert (SET: the bucket gives it a new CAS) or, when its
  `_change_type` is "delete" (or its `event` a deletion or expiration), a remove (DELETE; removing
  a missing key is not an error). Columns: `key` and `value` (STRING, BINARY, or a struct written
  as JSON), optional `flags`, `expiry` (absolute Unix time) and `datatype`.
* `withMeta=true`: SetWithMeta / DelWithMeta (IS_EXPIRATION for an `event` "expiration") with
  the rows' `cas`, `rev_seqno`, `flags` and `expiry`, so the bucket holds the very versions the rows
  describe (CAS included), and its conflict resolution keeps a newer version it already has (those
  rows are counted as rejected, not failed). This is how `dcpflow restore` writes the change log
  back; the rows of `spark.read.format("dcp")` and of the pipeline's change log have these columns.

Rows with `scope` and `collection` columns (those of the `dcp` source and the change log) go to
the collection of those names in the target bucket, which must exist; rows without them to the
default collection. Rows whose `_change_type` is "rollback" or "drop" (markers of the change log)
are skipped. A change the bucket refuses for another reason fails the task, which Spark retries;
writing the same rows again is harmless in both modes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage

from .options import DcpOptionError, DcpOptions
from .schema import CHANGE_TYPE, DELETE, DROP, ROLLBACK

U64 = 0xFFFFFFFFFFFFFFFF


@dataclass
class WriteResult(WriterCommitMessage):
    written: int = 0
    rejected: int = 0  # withMeta: the bucket's version won conflict resolution
    skipped: int = 0  # rollback markers


def _flag(raw: dict, name: str) -> bool:
    value = str(raw.get(name, "false")).strip().lower()
    if value not in ("true", "false"):
        raise DcpOptionError(f"option {name!r} must be true or false, not {raw.get(name)!r}")
    return value == "true"


def write_settings(raw: dict) -> tuple[bool, int]:
    """(withMeta, writeBatchSize) from the options, case-insensitively."""
    lower = {k.lower(): v for k, v in raw.items()}
    with_meta = _flag({"withMeta": lower.get("withmeta", "false")}, "withMeta")
    try:
        batch = int(lower.get("writebatchsize", 1000))
    except ValueError:
        batch = 0
    if batch < 1:
        raise DcpOptionError(f"option 'writeBatchSize' must be a positive integer, not {lower.get('writebatchsize')!r}")
    return with_meta, batch


def row_change(row, with_meta: bool):
    """The Change a row asks for, or None for a marker (a rollback, or a collection's drop)."""
    from dcpflow.client.with_meta import DELETE as DEL
    from dcpflow.client.with_meta import EXPIRE, SET, Change

    d = row.asDict(recursive=True)
    if d.get(CHANGE_TYPE) in (ROLLBACK, DROP):
        return None
    event = d.get("event")
    if d.get(CHANGE_TYPE) == DELETE or event in ("deletion", "expiration"):
        kind = EXPIRE if event == "expiration" and with_meta else DEL
    else:
        kind = SET
    key = d.get("key")
    if key is None:
        raise DcpOptionError("format('dcp') writes need a non-null 'key' column")
    key = key.encode() if isinstance(key, str) else bytes(key)
    value = d.get("value")
    if value is None:
        value = b""
    elif isinstance(value, str):
        value = value.encode()
    elif isinstance(value, dict):
        value = json.dumps(value, separators=(",", ":")).encode()
    else:
        value = bytes(value)
    datatype = int(d.get("datatype") or 0) & 0x01  # JSON; the values of the rows are decompressed bodies
    if kind != SET:
        value, datatype = b"", 0
    cas = rev = 0
    if with_meta:
        if d.get("cas") is None or d.get("rev_seqno") is None:
            raise DcpOptionError("withMeta=true needs 'cas' and 'rev_seqno' columns (as the dcp source and the "
                                 "change log have)")
        cas, rev = int(d["cas"]) & U64, int(d["rev_seqno"])
    return Change(kind, key, value, cas, rev, int(d.get("flags") or 0), int(d.get("expiry") or 0), datatype)


class TargetCollections:
    """The target collection of a row: the one with its `scope` and `collection` names in the target
    bucket (rows without those columns, or with empty names, go to the default collection). A name
    the target does not have is an error that says so: documents are never put into another
    collection than their own."""

    def __init__(self, manifest, bucket: str):
        self.manifest, self.bucket = manifest, bucket
        self._ids: dict[tuple[str, str], int] = {("_default", "_default"): 0, ("", ""): 0}

    def of(self, row) -> int:
        d = row.asDict() if hasattr(row, "asDict") else dict(row)
        names = (d.get("scope") or "", d.get("collection") or "")
        cid = self._ids.get(names)
        if cid is None:
            info = self.manifest.collection(*names)
            if info is None:
                raise DcpOptionError(f"bucket {self.bucket!r} has no collection {names[0]}.{names[1]}: create it "
                                     f"(dcpflow collections create, or the SDK's collection manager) before "
                                     f"writing its documents")
            cid = self._ids[names] = info.cid
        return cid


class DcpWriter(DataSourceWriter):
    def __init__(self, opts: DcpOptions, raw: dict):
        self.opts = opts
        self.with_meta, self.batch_size = write_settings(raw)

    def write(self, iterator) -> WriteResult:
        return asyncio.run(self._write(iterator))

    async def _write(self, iterator) -> WriteResult:
        from dcpflow.client.with_meta import Target

        result = WriteResult()
        target = await asyncio.wait_for(Target.connect(self.opts.connection_string, self.opts.username,
                                                       self.opts.password), self.opts.timeout)
        try:
            if self.with_meta:  # LWW buckets take *WithMeta only with FORCE_ACCEPT_WITH_META_OPS
                from dcpflow.client.with_meta import bucket_conflict_mode
                mode = await bucket_conflict_mode(target.client, self.opts.username, self.opts.password)
                target.lww = mode == "lww"
            collections = TargetCollections(await target.client.manifest(), self.opts.bucket)
            batch = []
            for row in iterator:
                change = row_change(row, self.with_meta)
                if change is None:
                    result.skipped += 1
                    continue
                cid = collections.of(row)
                if cid:
                    change = change._replace(collection=cid)
                batch.append(change)
                if len(batch) >= self.batch_size:
                    await self._flush(target, batch, result)
                    batch = []
            if batch:
                await self._flush(target, batch, result)
        finally:
            await target.close()
        return result

    async def _flush(self, target, batch, result: WriteResult) -> None:
        outcomes = await (target.write(batch) if self.with_meta else target.write_plain(batch))
        for change, o in zip(batch, outcomes, strict=True):
            if o.status == 0:
                result.written += 1
            elif o.status == 0x02 and self.with_meta:
                result.rejected += 1
            else:
                raise RuntimeError(f"bucket {self.opts.bucket!r} refused the {change.kind} of {change.key!r} "
                                   f"with status 0x{o.status:x}")

    def commit(self, messages) -> None:
        pass  # every task's writes are already in the bucket

    def abort(self, messages) -> None:
        pass  # what was written stays: writing the same rows again is harmless
