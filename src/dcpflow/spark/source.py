"""The `dcp` PySpark data source: `spark.read.format("dcp")` and `spark.readStream.format("dcp")`.

A thin layer over the asyncio DCP client (dcpflow.client): planning (which vbuckets, which seqno
ranges, how many Spark tasks) happens on the driver in offsets.py; each Spark task opens one
client connection and streams its group of vbucket ranges as Arrow record batches (schema.py).

Where things run: `schema()`, `partitions()`, `initialOffset()`,
`latestOffset()` and `commit()` run in a long-lived Python process on the driver, so the stream
reader keeps one client connection open across micro-batches; `read()` runs in executor workers,
which get the pickled reader and import this module by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from . import offsets as off
from .options import DcpOptionError, DcpOptions, parse_options
from .schema import BatchConverter, arrow_schema, delivered, infer_json_schema, schema_ddl, value_ddl

log = logging.getLogger("dcpflow.spark")


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (faster socket reads), else the default loop."""
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class ClientSession:
    """One DcpClient driven from synchronous Spark callbacks on a private event loop; reconnects
    if the connection was lost between two calls."""

    def __init__(self, opts: DcpOptions):
        self.opts = opts
        self.loop = new_loop()
        self.client = None

    def run(self, coro_fn):
        """Run `await coro_fn(client)` to completion on this session's loop."""
        async def call():
            if self.client is None:
                self.client = await connect(self.opts)
            return await coro_fn(self.client)
        try:
            return self.loop.run_until_complete(call())
        except ConnectionError:
            self._drop()
            return self.loop.run_until_complete(call())

    def _drop(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):  # the connection is already gone
                self.loop.run_until_complete(client.close())

    def close(self) -> None:
        self._drop()
        self.loop.close()


async def connect(opts: DcpOptions):
    from dcpflow.client import DcpClient

    return await asyncio.wait_for(DcpClient.connect(opts.connection_string, username=opts.username,
                                                    password=opts.password, buffer_size=opts.buffer_size),
                                  opts.timeout)


async def server_state(client, vbuckets, logs_of=None) -> tuple[dict[int, int], dict[int, list[tuple[int, int]]]]:
    """High seqnos of these vbuckets, now, and the failover logs of `logs_of` (default: all of them;
    a request per vbucket, so a caller that needs few asks for those)."""
    vbs = list(vbuckets)
    high = await client.high_seqnos(vbs)
    want = vbs if logs_of is None else list(logs_of)
    logs = await client.failover_logs(want) if want else {}
    return ({vb: int(high.get(vb, 0)) for vb in vbs},
            {vb: [(int(u), int(s)) for u, s in logs.get(vb, [])] for vb in want})


async def collection_ids(client, opts: DcpOptions, first: bool) -> dict[str, int] | None:
    """With the `collections` option: each name's collection id now (names missing now are left
    out, as dropped; at a query's first plan a missing name is an error, as for the client)."""
    if not opts.collections:
        return None
    from dcpflow.client.manifest import Filter

    manifest = await client.manifest()
    out, missing = {}, []
    for scope, name in Filter.build(opts.scope, opts.collections).collections:
        c = manifest.collection(scope, name)
        if c is None:
            missing.append(f"{scope}.{name}")
        else:
            out[f"{scope}.{name}"] = c.cid
    if missing and first:
        raise DcpOptionError(f"option 'collections': bucket {opts.bucket!r} has no {', '.join(missing)} "
                             f"(manifest uid {manifest.uid:x})")
    return out


def persisted_cap(high: dict[int, int], persisted: dict[int, int], start: off.SourceOffset) -> dict[int, int]:
    """With mitigateRollbacks: each vbucket's high seqno lowered to what the active and every
    replica the cluster map lists have persisted (DcpClient.persisted_seqnos), so a batch never
    plans a change a failover could take back. Never below the start offset: a copy that persisted
    less than was already read (a replica being rebuilt) holds the vbucket still, and is not a
    rollback; a high seqno below the start (the server's history really went back) is kept as it
    is, for rollback detection."""
    out = {}
    for vb, h in high.items():
        s = start.vbuckets.get(vb)
        if s is not None and s.seqno > h:
            out[vb] = h
        else:
            out[vb] = max(s.seqno if s is not None else 0, min(h, persisted.get(vb, 0)))
    return out


def chosen_vbuckets(opts: DcpOptions, num_vbuckets: int) -> list[int]:
    """The vbuckets to read; options naming a vbucket the bucket does not have are errors (an
    offset for one would otherwise be dropped without a word)."""
    named = [("vbuckets", opts.vbuckets or ())]
    for name, spec in (("startingOffsets", opts.starting_offsets), ("endingOffsets", opts.ending_offsets)):
        if isinstance(spec, off.OffsetSpec):
            named.append((name, sorted(spec.vbuckets)))
    for name, vbs in named:
        bad = [vb for vb in vbs if vb >= num_vbuckets]
        if bad:
            raise DcpOptionError(f"option {name!r}: bucket {opts.bucket!r} has {num_vbuckets} vbuckets "
                                 f"(0..{num_vbuckets - 1}); {bad[:5]} do not exist")
    if opts.vbuckets is None:
        return list(range(num_vbuckets))
    return list(opts.vbuckets)


# ---------------------------------------------------------------------------------------------
# The data source


class DcpDataSource(DataSource):
    """format("dcp"): a bucket's changes as rows (see docs/spark.md for options and columns)."""

    @classmethod
    def name(cls) -> str:
        return "dcp"

    def __init__(self, options):
        super().__init__(options)
        self.opts = parse_options(options)  # bad options fail at load(), naming the option

    def schema(self) -> str:
        opts = self.opts
        if opts.value_format == "json" and opts.value_schema is None:
            return schema_ddl(opts.key_format, value_ddl("json", inferred=sample_json_schema(opts)))
        return schema_ddl(opts.key_format, value_ddl(opts.value_format, opts.value_schema))

    def reader(self, schema) -> DcpBatchReader:
        return DcpBatchReader(self.opts, schema)

    def writer(self, schema, overwrite: bool):
        """df.write.format("dcp"): upserts and removes, or with withMeta=true writes with metadata."""
        from .writer import DcpWriter
        if overwrite:
            raise DcpOptionError("format('dcp') writes add to a bucket: use mode('append') (a bucket is not "
                                 "truncated by a DataFrame write; flush it first if that is what you want)")
        return DcpWriter(self.opts, dict(self.options))

    def streamReader(self, schema) -> DcpStreamReader:
        if self.opts.ending_offsets is not None:
            raise DcpOptionError("option 'endingOffsets' applies to batch reads (spark.read) only; a stream "
                                 "runs until stopped (use Trigger.AvailableNow to stop at the seqnos of its start)")
        return DcpStreamReader(self.opts, schema)


def sample_json_schema(opts: DcpOptions):
    """Infer the JSON value schema from up to `inferSchemaSamples` current documents, taken from
    the fullest vbuckets first (one short stream each)."""
    session = ClientSession(opts)
    try:
        async def sample(client):
            vbs = chosen_vbuckets(opts, client.num_vbuckets)
            high, logs = await server_state(client, vbs)
            found: list[bytes] = []
            for vb in sorted(vbs, key=lambda v: -high[v])[:64]:
                if high[vb] == 0 or len(found) >= opts.infer_schema_samples:
                    break
                from dcpflow.client import Offset
                batches = client.batches({vb: Offset(0, 0, 0, 0)}, {vb: high[vb]},
                                         max_rows=min(opts.max_rows_per_batch, 4096), **opts.filters)
                try:
                    async for batch in batches:
                        found.extend(v for v in batch.column("value").to_pylist() if v is not None)
                        if len(found) >= opts.infer_schema_samples:
                            break
                finally:
                    await batches.aclose()
            return found[:opts.infer_schema_samples]
        docs = session.run(sample)
    finally:
        session.close()
    return infer_json_schema(docs)


class DcpPartition(InputPartition):
    """A group of vbucket ranges read by one Spark task, stamped with the micro-batch number."""

    def __init__(self, ranges: list[off.VbRange], commit_version: int):
        super().__init__(None)
        self.ranges = ranges
        self.commit_version = commit_version

    def __repr__(self) -> str:
        return f"DcpPartition(vbuckets={[r.vbucket for r in self.ranges]}, version={self.commit_version})"


def make_partitions(opts: DcpOptions, start: off.SourceOffset, end: off.SourceOffset) -> list[DcpPartition]:
    return [DcpPartition(g, end.batch) for g in off.group(off.ranges(start, end), opts.partitions)]


class DcpBatchReader(DataSourceReader):
    """A snapshot of the bucket up to the high seqnos at planning time (or endingOffsets)."""

    def __init__(self, opts: DcpOptions, schema):
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[DcpPartition]:
        opts = self.opts
        session = ClientSession(opts)
        try:
            async def state(client):
                vbs = chosen_vbuckets(opts, client.num_vbuckets)
                return vbs, *(await server_state(client, vbs)), await collection_ids(client, opts, True)
            vbs, high, logs, colls = session.run(state)
        finally:
            session.close()
        uuids = {vb: (logs[vb][0][0] if logs[vb] else 0) for vb in vbs}
        if opts.starting_offsets == "latest":
            raise DcpOptionError("startingOffsets=latest makes an empty batch read; use earliest or JSON offsets")
        start = off.SourceOffset(off.resolve(opts.starting_offsets, vbs, high, uuids), 0)
        limit = dict(high)
        if opts.mitigate_rollbacks:
            session = ClientSession(opts)
            try:
                persisted = session.run(lambda client: client.persisted_seqnos(vbs, uuids))
            finally:
                session.close()
            limit = persisted_cap(limit, persisted, start)
        if opts.ending_offsets not in (None, "latest"):
            if opts.ending_offsets == "earliest":
                raise DcpOptionError("endingOffsets=earliest makes an empty batch read; use latest or JSON offsets")
            ends = off.resolve(opts.ending_offsets, vbs, high, uuids, default="latest")
            limit = {vb: min(high[vb], ends[vb].seqno) for vb in vbs}
        end = off.plan(start, limit, logs, None, opts.rollback, colls)
        return make_partitions(opts, start, end)

    def read(self, partition: DcpPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, self.schema, partition)


class DcpStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of (start seqno, end seqno] per vbucket, with admission control
    (maxSeqnosPerTrigger / maxBytesPerTrigger), Trigger.AvailableNow and rollback repair."""

    #: Spark asks for the starting point three or four times in a row when a query starts
    #: (prepareForTriggerAvailableNow, initialOffset, latestOffset, initialOffset again); asking the
    #: server is a request per vbucket each time, and a view this young is as good as a new one.
    STATE_REUSE_SECONDS = 0.5

    def __init__(self, opts: DcpOptions, schema):
        self.opts = opts
        self.schema = schema
        self._session: ClientSession | None = None
        self._vbuckets: list[int] | None = None
        self._target: dict[int, int] | None = None  # AvailableNow: high seqnos when the query started
        self._initial: dict | None = None  # initialOffset(), fixed once answered
        self._seen: tuple[float, tuple] | None = None  # (monotonic time, _state()'s answer)
        self._latest: off.SourceOffset | None = None
        self._item_bytes: float | None = None
        self._colls: dict[str, int] | None = None  # the `collections` names' ids, as last seen

    # The session is driver-only state; workers get a pickled reader without it.
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_session"] = None
        return state

    def _state(self):
        """(high seqnos, failover logs, newest vbuuids) of the vbuckets read: a view of the server
        at most STATE_REUSE_SECONDS old."""
        now = time.monotonic()
        if self._seen is not None and now - self._seen[0] < self.STATE_REUSE_SECONDS:
            return self._seen[1]
        if self._session is None:
            self._session = ClientSession(self.opts)

        async def state(client):
            if self._vbuckets is None:
                self._vbuckets = chosen_vbuckets(self.opts, client.num_vbuckets)
            high, logs = await server_state(client, self._vbuckets)
            return high, logs, await collection_ids(client, self.opts, self._colls is None)
        high, logs, colls = self._session.run(state)
        if colls is not None:
            self._colls = colls
        uuids = {vb: (logs[vb][0][0] if logs[vb] else 0) for vb in high}
        self._latest = off.SourceOffset({vb: off.Offset.at(uuids[vb], high[vb]) for vb in high})
        self._seen = (time.monotonic(), (high, logs, uuids))
        return high, logs, uuids

    def initialOffset(self) -> dict:
        """The same answer every time it is asked: Spark asks again to plan the first batch, and
        with startingOffsets=latest a second look at the server would skip what came between."""
        if self._initial is None:
            high, logs, uuids = self._state()
            spec = self.opts.starting_offsets
            batch = spec.batch if isinstance(spec, off.OffsetSpec) else 0
            self._initial = off.SourceOffset(off.resolve(spec, self._vbuckets, high, uuids), batch,
                                             initial=True).to_json()
        return self._initial

    def getDefaultReadLimit(self):
        if self.opts.max_seqnos_per_trigger is not None:
            return ReadMaxRows(self.opts.max_seqnos_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        high, _, _ = self._state()
        self._target = dict(high)

    def latestOffset(self, start: dict, limit) -> dict:
        start_off = off.SourceOffset.from_json(start)
        if self._reached_target(start_off):
            # AvailableNow has read everything up to its target, planned from this view: asking
            # the server again (a request per vbucket, on the query's critical path) could
            # only find a rollback newer than the data read, which the next query's first plan
            # finds all the same.
            high, logs, _ = self._seen[1]
        else:
            high, logs, _ = self._state()
        if self._target is not None:
            high = {vb: min(h, self._target.get(vb, h)) for vb, h in high.items()}
        if self.opts.mitigate_rollbacks:
            uuids = {vb: (logs[vb][0][0] if logs.get(vb) else 0) for vb in high}
            persisted = self._session.run(lambda client: client.persisted_seqnos(list(high), uuids))
            high = persisted_cap(high, persisted, start_off)
        added = [vb for vb in self._vbuckets if vb not in start_off.vbuckets]
        if added:
            # The `vbuckets` option grew since the checkpoint was written: the new vbuckets start
            # from the beginning (as a Kafka source does with new partitions); planning only from
            # the checkpoint's vbuckets would never read them.
            log.warning("dcp source: vbuckets %s are not in the checkpoint's offset; reading them from the "
                        "beginning", added[:16])
            start_off = off.SourceOffset({**start_off.vbuckets, **dict.fromkeys(added, off.EARLIEST)},
                                         start_off.batch, start_off.resets, start_off.initial,
                                         collections=start_off.collections)
        end = off.plan(start_off, high, logs, self._budget(limit), self.opts.rollback, self._colls)
        if end is start_off:
            return start  # nothing to read: the offset Spark holds, unchanged
        return end.to_json()

    def _reached_target(self, start: off.SourceOffset) -> bool:
        target, vbuckets = self._target, self._vbuckets
        return (target is not None and self._seen is not None and vbuckets is not None and
                all(vb in start.vbuckets and start.vbuckets[vb].seqno >= target.get(vb, 0) for vb in vbuckets))

    def _budget(self, limit) -> int | None:
        """Seqnos this batch may cover. A byte limit becomes seqnos through the average item size,
        sampled once from the server (DCP reveals sizes only by reading)."""
        if isinstance(limit, ReadAllAvailable):
            return None
        budgets = []
        if isinstance(limit, ReadMaxRows):
            budgets.append(limit.max_rows)
        if self.opts.max_seqnos_per_trigger is not None:
            budgets.append(self.opts.max_seqnos_per_trigger)
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.opts.max_bytes_per_trigger
        if max_bytes is not None:
            budgets.append(max(1, int(max_bytes // self._average_item_bytes())))
        return min(budgets) if budgets else None

    def _average_item_bytes(self) -> float:
        if self._item_bytes is None:
            async def sample(client):
                from dcpflow.client import Offset
                high = await client.high_seqnos(self._vbuckets)
                sizes: list[int] = []
                for vb in sorted(high, key=lambda v: -high[v])[:8]:
                    if high[vb] == 0:
                        break
                    batches = client.batches({vb: Offset(0, 0, 0, 0)}, {vb: min(high[vb], 256)}, max_rows=256)
                    try:
                        async for batch in batches:
                            keys, values = batch.column("key"), batch.column("value")
                            sizes.extend((len(k or b"") + len(v or b"") + 64)
                                         for k, v in zip(keys.to_pylist(), values.to_pylist(), strict=True))
                    finally:
                        await batches.aclose()
                return sum(sizes) / len(sizes) if sizes else 1024.0
            self._item_bytes = self._session.run(sample)
        return self._item_bytes

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else self._latest.to_json()

    def partitions(self, start: dict, end: dict) -> list[DcpPartition]:
        return make_partitions(self.opts, off.SourceOffset.from_json(start), off.SourceOffset.from_json(end))

    def read(self, partition: DcpPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, self.schema, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: each batch's streams end with the batch (bounded DCP streams)."""

    def stop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


# ---------------------------------------------------------------------------------------------
# Reading (executor side)


def read_partition(opts: DcpOptions, schema, partition: DcpPartition) -> Iterator[pa.RecordBatch]:
    """Stream the partition's vbucket ranges and yield batches of the source's Arrow schema.

    Runs the async client on a private loop, one `__anext__` at a time, so flow control holds the
    server back while Spark consumes a batch. Rollback repair (docs/spark.md): a range planned as
    a reset yields a rollback marker and everything from seqno 0; a vbucket whose history changed
    after planning (newest vbuuid differs, or the server answers ROLLBACK) is repaired the same way
    up to its current high seqno, and the next batch's planning sees the change and repeats it.
    """
    converter = BatchConverter(arrow_schema(schema), opts.key_format, opts.value_format, sync_writes=opts.sync_writes)
    loop = new_loop()
    reader = _RangeReader(opts, converter, partition)
    agen = reader.run()
    try:
        while True:
            try:
                batch = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                break
            yield batch
    finally:
        loop.run_until_complete(agen.aclose())
        loop.close()


class _RangeReader:
    def __init__(self, opts: DcpOptions, converter: BatchConverter, partition: DcpPartition):
        self.opts = opts
        self.converter = converter
        self.partition = partition
        self.version = partition.commit_version

    async def run(self):
        opts = self.opts
        client = await connect(opts)
        self.converter.names = client.names.of
        try:
            ranges = self.partition.ranges
            vbs = sorted({r.vbucket for r in ranges})
            # a range from seqno 0 has no history to check: only the others need their failover
            # logs (a request per vbucket, at every task start)
            high, logs = await server_state(client, vbs, sorted({r.vbucket for r in ranges
                                                                 if not r.reset and r.start.seqno > 0}))
            # Every range of a batch reads the collection ids the driver planned (offsets.ranges), or
            # with None the options' filter; () when every planned id was dropped: nothing to read.
            cids = ranges[0].cids if ranges else None
            filters = opts.filters if cids is None else {"collection_ids": list(cids), "history": opts.history,
                                                         "sync_writes": opts.sync_writes}
            async for batch in self._read(client, ranges, high, logs, filters, nothing=cids == ()):
                yield batch
            if "collection_id" in self.converter.target.names:
                for r in ranges:  # names the driver saw go (or move to another id)
                    for cid, name in r.dropped:
                        scope, _, coll = name.partition(".")
                        yield self.converter.drop_row(r.vbucket, r.end_seqno, r.end_vbuuid, cid, scope, coll,
                                                      self.version)
        finally:
            await client.close()

    async def _read(self, client, ranges: list, high: dict, logs: dict, filters: dict, nothing: bool):
        """The partition's ranges, read with `filters` (client.batches' filter arguments); with
        `nothing` only their rollback markers."""
        from dcpflow.client import Offset, RollbackError

        opts = self.opts
        normal: dict[int, tuple[Offset, int]] = {}
        repairs: list[int] = []
        for r in ranges:
            if r.reset:
                yield self.converter.rollback_marker(r.vbucket, r.end_vbuuid, self.version)
                if r.end_seqno > 0 and not nothing:
                    normal[r.vbucket] = (Offset(0, 0, 0, 0), min(r.end_seqno, high[r.vbucket]))
            elif nothing:
                continue
            elif off.diverged(r.start, logs.get(r.vbucket, []), high[r.vbucket]):
                repairs.append(r.vbucket)
            else:
                normal[r.vbucket] = (r.start, min(r.end_seqno, high[r.vbucket]))
        yielded: dict[int, int] = {}  # vbucket -> highest seqno delivered (a resume repeats nothing)
        resumed = False
        while normal or repairs:
            for vb in repairs:
                async for batch in self._repair(client, vb, filters):
                    yield batch
                normal.pop(vb, None)
            repairs = []
            normal = {vb: (o, e) for vb, (o, e) in normal.items() if o.seqno < e}
            if not normal:
                break
            ends = {vb: e for vb, (_, e) in normal.items()}
            batches = client.batches({vb: o for vb, (o, _) in normal.items()}, ends,
                                     max_rows=opts.max_rows_per_batch, **filters)
            try:
                async for batch in batches:
                    for marker in self._drops(batches, yielded if resumed else None):
                        yield marker
                    if batch.num_rows == 0:
                        continue
                    out = self.converter.convert(batch, self.version, ends, yielded if resumed else None)
                    delivered(out, yielded)
                    yield out
                for marker in self._drops(batches, yielded if resumed else None):
                    yield marker
                normal = {}
            except RollbackError as e:
                if opts.rollback == "fail":
                    raise RuntimeError(f"dcp source: {e} (rollback=fail)") from e
                if e.vbucket in yielded:
                    # Rows of this vbucket already left in this attempt; a marker now could not
                    # void them (same _commit_version). Fail the task: its retry checks the
                    # failover log first and re-reads the vbucket from 0 before yielding any.
                    raise RuntimeError(f"dcp source: vbucket {e.vbucket} rolled back in the middle of the read "
                                       "(the server's history changed); the task must be retried") from e
                repairs = [e.vbucket]
                resumed = True
                # Resume the others where they stood (the client's positions carry the
                # snapshot they are in); the rolled-back one is re-read from 0.
                stood = getattr(batches, "offsets", None) or {}
                normal = {vb: (stood.get(vb, o), e_) for vb, (o, e_) in normal.items()
                          if vb != e.vbucket and stood.get(vb, o).seqno < e_}
            finally:
                await batches.aclose()

    def _drops(self, reader, floors: dict[int, int] | None) -> list[pa.RecordBatch]:
        """A `drop` row for each collection the read saw dropped (taken from the reader)."""
        out = []
        if "collection_id" not in self.converter.target.names:
            reader.system_events.clear()
            return out
        for ev in reader.system_events:
            if ev.kind == "collection_dropped" and (floors is None or ev.seqno > floors.get(ev.vbucket, -1)):
                out.append(self.converter.drop_marker(ev, self.version))
        reader.system_events.clear()
        return out

    async def _repair(self, client, vb: int, filters: dict):
        """Marker, then the vbucket from seqno 0 to its current high seqno."""
        from dcpflow.client import Offset, RollbackError

        if self.opts.rollback == "fail":
            raise RuntimeError(f"dcp source: vbucket {vb}'s history changed after the batch was planned "
                               "(rollback=fail)")
        for _attempt in range(5):
            high, logs = await server_state(client, [vb])
            newest = logs[vb][0][0] if logs[vb] else 0
            yield self.converter.rollback_marker(vb, newest, self.version)
            if high[vb] == 0:
                return
            batches = client.batches({vb: Offset(0, 0, 0, 0)}, {vb: high[vb]}, max_rows=self.opts.max_rows_per_batch,
                                     **filters)
            try:
                async for batch in batches:
                    for marker in self._drops(batches, None):
                        yield marker
                    if batch.num_rows:
                        yield self.converter.convert(batch, self.version, high)
                for marker in self._drops(batches, None):
                    yield marker
                return
            except RollbackError:  # the history moved again while we re-read: start over
                continue
            finally:
                await batches.aclose()
        raise RuntimeError(f"dcp source: vbucket {vb} kept changing history while being re-read")
