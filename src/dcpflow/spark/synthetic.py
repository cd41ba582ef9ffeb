"""format("dcp_synthetic"): the `dcp` source's batches without a server - the benchmark's baseline.

It yields exactly what the `dcp` source yields for a bucket loaded by `dcpflow load` (same Arrow
schema, same document kinds and sizes, keys spread over vbuckets, grouped into the same number of
partitions) and goes through the same BatchConverter, but builds the client-shaped batches with
vectorised Arrow instead of reading them from a socket. The ratio dcp / synthetic is therefore the
cost of the client and server per row; synthetic / `spark.range` is the cost of Python.

Options: rows (default 1,000,000), vbuckets (1024), partitions (cores), maxRowsPerBatch (32768),
keyFormat, valueFormat (binary|string), seed (42).

As a stream (`readStream`), the `rows` documents are there from the start and arrive in one
micro-batch: the baseline for the change log, which is written by a streaming query and so pays
Spark's per-query and per-batch costs (a Python reader process, offset and commit logs) that a
batch read does not.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from .schema import BatchConverter, arrow_schema, schema_ddl, value_ddl

POOL = 4096


class _Slice(InputPartition):
    def __init__(self, start: int, stop: int):
        super().__init__(None)
        self.start, self.stop = start, stop


class SyntheticDcpDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "dcp_synthetic"

    def __init__(self, options):
        super().__init__(options)
        o = {k.lower(): v for k, v in options.items()}
        self.rows = int(o.get("rows", 1_000_000))
        self.vbuckets = int(o.get("vbuckets", 1024))
        self.partitions_n = int(o.get("partitions", os.cpu_count() or 2))
        self.max_rows = int(o.get("maxrowsperbatch", 32768))
        self.key_format = o.get("keyformat", "string")
        self.value_format = o.get("valueformat", "binary")
        self.seed = int(o.get("seed", 42))
        if self.value_format not in ("binary", "string"):
            raise ValueError("dcp_synthetic: valueFormat must be binary or string")

    def schema(self) -> str:
        return schema_ddl(self.key_format, value_ddl(self.value_format))

    def reader(self, schema) -> SyntheticReader:
        return SyntheticReader(self, schema)

    def streamReader(self, schema) -> SyntheticStreamReader:
        return SyntheticStreamReader(self, schema)


def _slices(lo: int, hi: int, n: int) -> list[_Slice]:
    n = max(1, n)
    bounds = [lo + (hi - lo) * i // n for i in range(n + 1)]
    return [_Slice(bounds[i], bounds[i + 1]) for i in range(n) if bounds[i + 1] > bounds[i]]


class SyntheticReader(DataSourceReader):
    def __init__(self, source: SyntheticDcpDataSource, schema):
        self.s = source
        self.schema = schema

    def partitions(self):
        return _slices(0, self.s.rows, self.s.partitions_n)

    def read(self, partition: _Slice) -> Iterator[pa.RecordBatch]:
        from dcpflow.client.workload import key_for, make_doc

        s = self.s
        keys_pool = [key_for(i, s.seed) for i in range(POOL)]
        values = pa.array([make_doc(k, 0, s.seed) for k in keys_pool], pa.binary())
        kinds = pa.array([k.partition("::")[0] + "::" for k in keys_pool], pa.binary())
        converter = BatchConverter(arrow_schema(self.schema), s.key_format, s.value_format)
        for lo in range(partition.start, partition.stop, s.max_rows):
            hi = min(lo + s.max_rows, partition.stop)
            n = hi - lo
            idx = np.arange(lo, hi, dtype=np.int64)
            pool_idx = pa.array(idx % POOL)
            keys = pc.binary_join_element_wise(kinds.take(pool_idx),
                                               pc.utf8_lpad(pa.array(idx).cast(pa.string()), 8, "0").cast(pa.binary()),
                                               b"")
            vb = pa.array((idx % s.vbuckets).astype(np.int32))
            seq = pa.array(idx // s.vbuckets + 1)
            zeros = pa.array(np.zeros(n, dtype=np.int64))
            batch = pa.RecordBatch.from_arrays(
                [vb, seq, pa.array(np.full(n, 0xABCDEF, dtype=np.int64)), keys, values.take(pool_idx),
                 pa.array(["mutation"] * n, pa.string()), pa.array(idx * 65536), pa.array(np.ones(n, np.int64)),
                 zeros, zeros, pa.array(np.ones(n, np.int32)), seq, seq],
                names=["vbucket", "seqno", "vbuuid", "key", "value", "event", "cas", "rev_seqno", "flags",
                       "expiry", "datatype", "snapshot_start", "snapshot_end"])
            yield converter.convert(batch, 0)


class SyntheticStreamReader(DataSourceStreamReader):
    """Offsets {"rows": n}: the first n documents have been read."""

    def __init__(self, source: SyntheticDcpDataSource, schema):
        self.s = source
        self.batch = SyntheticReader(source, schema)

    def initialOffset(self) -> dict:
        return {"rows": 0}

    def latestOffset(self, start: dict, limit) -> dict:
        return {"rows": self.s.rows}

    def partitions(self, start: dict, end: dict) -> list[_Slice]:
        return _slices(start["rows"], end["rows"], self.s.partitions_n)

    def read(self, partition: _Slice) -> Iterator[pa.RecordBatch]:
        return self.batch.read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release."""
