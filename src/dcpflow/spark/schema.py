"""The columns of the `dcp` source and the conversion of client batches into them.

Spark checks the Arrow schema of the first batch a reader yields against the Spark schema
converted to Arrow, *exactly* (`string`, not `large_string`; `int32` for `int`; nullability), and
fails the query with DATA_SOURCE_RETURN_SCHEMA_MISMATCH otherwise. So the Arrow schema is always
derived from the Spark schema with Spark's own converter, and every batch is built against it.

Values: `binary` passes the bytes through, `string` decodes UTF-8, `json` parses into a struct
(a user schema, or one inferred from a sample). JSON parsing is vectorised with Arrow's JSON
reader (one newline-delimited buffer per batch); only a batch Arrow refuses falls back to
`json.loads` row by row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from dcpflow.client.batches import as_int64

# Columns as the client yields them (docs/client.md) ...
CLIENT_COLUMNS = ("vbucket", "seqno", "vbuuid", "key", "value", "event", "cas", "rev_seqno", "flags", "expiry",
                  "datatype", "snapshot_start", "snapshot_end")
# ... and the two added for users of Spark's CDC tooling (Delta's change-data-feed names).
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"

UPSERT, DELETE, ROLLBACK, DROP, PREPARE, COMMIT, ABORT = (
    "upsert", "delete", "rollback", "drop", "prepare", "commit", "abort")
"""`_change_type` values. DCP cannot tell an insert from an update (both are mutations), so a
mutation is an upsert; deletions and expirations are deletes; `rollback` marks a vbucket whose
history the server rolled back: every earlier row of that vbucket is void (see docs/spark.md);
`drop` says a collection was dropped (one row per vbucket, event `collection_dropped`, with its
scope, name and id and an empty key): every key of that collection id is gone (ids are never
reused). With the `syncWrites` option, `prepare`, `commit` and `abort` rows (event the same)
record sync writes: a prepare holds the proposed value (null for a durable delete), a commit or an
abort only its key and seqno, and completes the latest prepare of its key; a committed sync write
then has no upsert or delete row of its own (the state table cannot be built from such a read)."""
#: The collection columns, after the client's: names as the client's manifest knows them.
COLLECTION_COLUMNS = ("scope", "collection", "collection_id")

JSON_DATATYPE = 0x01
_SYNC_EVENTS = pa.array([PREPARE, COMMIT, ABORT])


def schema_ddl(key_format: str = "string", value_ddl: str = "BINARY") -> str:
    """The source's schema as a DDL string. `value_ddl` is the Spark type of `value` (BINARY,
    STRING or a STRUCT<...> for JSON). DDL, not a StructType, because parsing a user's DDL needs
    the JVM, which the data source's Python planner does not have: Spark parses what we return."""
    key_type = "STRING" if key_format == "string" else "BINARY"
    return ", ".join([
        "vbucket INT NOT NULL", "seqno BIGINT NOT NULL", "vbuuid BIGINT NOT NULL", f"key {key_type} NOT NULL",
        f"value {value_ddl}", "event STRING NOT NULL", "cas BIGINT NOT NULL", "rev_seqno BIGINT NOT NULL",
        "flags BIGINT NOT NULL", "expiry BIGINT NOT NULL", "datatype INT NOT NULL",
        "snapshot_start BIGINT NOT NULL", "snapshot_end BIGINT NOT NULL", f"{CHANGE_TYPE} STRING NOT NULL",
        f"{COMMIT_VERSION} BIGINT NOT NULL", "scope STRING NOT NULL", "collection STRING NOT NULL",
        "collection_id BIGINT NOT NULL",
    ])


def value_ddl(value_format: str, value_schema: str | None = None, inferred=None) -> str:
    """DDL of the `value` column: a user's JSON schema `a STRING, b INT` becomes STRUCT<...>."""
    if value_format == "binary":
        return "BINARY"
    if value_format == "string":
        return "STRING"
    if value_schema is not None:
        return f"STRUCT<{value_schema}>"
    return type_ddl(inferred)


def type_ddl(t) -> str:
    """A Spark DataType as DDL, quoting field names (simpleString does not)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(t, StructType):
        if not t.fields:
            return "STRUCT<>"
        return "STRUCT<" + ", ".join(f"{_quote(f.name)}: {type_ddl(f.dataType)}" for f in t.fields) + ">"
    if isinstance(t, ArrayType):
        return f"ARRAY<{type_ddl(t.elementType)}>"
    if isinstance(t, MapType):
        return f"MAP<{type_ddl(t.keyType)}, {type_ddl(t.valueType)}>"
    return t.simpleString().upper()


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def arrow_schema(schema) -> pa.Schema:
    """Spark schema → the exact Arrow schema Spark expects from `read()`."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# ---------------------------------------------------------------------------------------------
# Conversion of client batches


class BatchConverter:
    """Turns client RecordBatches into batches of the source's Arrow schema. Built once per
    partition in the worker; `convert` is called per batch."""

    def __init__(self, target: pa.Schema, key_format: str, value_format: str, names=None, sync_writes: bool = False):
        self.target = target
        self.sync_writes = sync_writes
        #: collection id -> (scope, collection) names (the client's manifest.Names.of)
        self.names = names or (lambda cid: ("_default", "_default") if cid == 0 else ("", ""))
        self.key_format = key_format
        self.value_format = value_format
        self.value_type = target.field("value").type

    def convert(self, batch: pa.RecordBatch, commit_version: int, ends: dict[int, int] | None = None,
                floors: dict[int, int] | None = None) -> pa.RecordBatch:
        """`ends` caps each vbucket's seqnos (rows past a planned end belong to the next batch);
        `floors` drops rows at or below a seqno already delivered (after a resumed stream)."""
        if (ends or floors) and batch.num_rows:
            batch = cap_seqnos(batch, ends or {}, floors)
        n = batch.num_rows
        cols = {name: batch.column(name) for name in CLIENT_COLUMNS}
        cols["key"] = self._key(cols["key"])
        cols["value"] = self._value(cols["value"], cols["datatype"])
        event = cols["event"]
        change = pc.if_else(pc.equal(event, "mutation"), UPSERT, DELETE)
        if self.sync_writes:  # prepare, commit and abort rows keep their event as their change type
            change = pc.if_else(pc.is_in(event, value_set=_SYNC_EVENTS), event, change)
        cols[CHANGE_TYPE] = change
        cols[COMMIT_VERSION] = _int64s(np.full(n, commit_version, dtype=np.int64))
        if any(f.name in COLLECTION_COLUMNS for f in self.target):
            self._collections(batch, cols)
        arrays = [_cast(cols[f.name], f.type) for f in self.target]
        return pa.RecordBatch.from_arrays(arrays, schema=self.target)

    def _collections(self, batch: pa.RecordBatch, cols: dict) -> None:
        """scope / collection / collection_id columns: names of the few distinct ids of a batch."""
        n = batch.num_rows
        if "collection_id" in batch.schema.names:
            cid = batch.column("collection_id")
        else:
            cid = _int64s(np.zeros(n, dtype=np.int64))
        uniq = pc.unique(cid)
        pairs = [self.names(int(c)) for c in uniq.to_pylist()]
        where = pc.index_in(cid, value_set=uniq)
        cols["scope"] = pc.take(pa.array([p[0] for p in pairs], pa.string()), where)
        cols["collection"] = pc.take(pa.array([p[1] for p in pairs], pa.string()), where)
        cols["collection_id"] = cid

    def _row(self, row: dict) -> pa.RecordBatch:
        row.setdefault("scope", "")
        row.setdefault("collection", "")
        row.setdefault("collection_id", 0)
        arrays = [pa.array([row[f.name]], f.type) for f in self.target]
        return pa.RecordBatch.from_arrays(arrays, schema=self.target)

    def rollback_marker(self, vbucket: int, vbuuid: int, commit_version: int) -> pa.RecordBatch:
        """One row saying: forget everything this vbucket said before; a re-read from 0 follows."""
        return self._row({"vbucket": vbucket, "seqno": 0, "vbuuid": vbuuid,
                          "key": "" if self.key_format == "string" else b"", "value": None, "event": ROLLBACK,
                          "cas": 0, "rev_seqno": 0, "flags": 0, "expiry": 0, "datatype": 0, "snapshot_start": 0,
                          "snapshot_end": 0, CHANGE_TYPE: ROLLBACK, COMMIT_VERSION: commit_version})

    def drop_marker(self, event, commit_version: int) -> pa.RecordBatch:
        """One row for a collection_dropped system event (client.events.SystemEvent): every key of
        the collection is gone."""
        return self.drop_row(event.vbucket, event.seqno, event.vbuuid, event.collection_id, event.scope,
                             event.collection, commit_version)

    def drop_row(self, vbucket: int, seqno: int, vbuuid: int, cid: int, scope: str, collection: str,
                 commit_version: int) -> pa.RecordBatch:
        """A `drop` row: every key of collection `cid` is gone (a drop event, or a planner that saw
        the collection's name go or move to another id)."""
        return self._row({"vbucket": vbucket, "seqno": seqno, "vbuuid": as_int64(vbuuid),
                          "key": "" if self.key_format == "string" else b"", "value": None,
                          "event": "collection_dropped", "cas": 0, "rev_seqno": 0, "flags": 0, "expiry": 0,
                          "datatype": 0, "snapshot_start": seqno, "snapshot_end": seqno, CHANGE_TYPE: DROP,
                          COMMIT_VERSION: commit_version, "scope": scope, "collection": collection,
                          "collection_id": cid})

    def _key(self, keys: pa.Array) -> pa.Array:
        if self.key_format == "binary":
            return keys
        return _to_string(keys)

    def _value(self, values: pa.Array, datatypes: pa.Array) -> pa.Array:
        if self.value_format == "binary":
            return values
        if self.value_format == "string":
            return _to_string(values)
        return parse_json(values, self.value_type)


def cap_seqnos(batch: pa.RecordBatch, ends: dict[int, int], floors: dict[int, int] | None = None) -> pa.RecordBatch:
    """Keep rows with floor[vb] < seqno <= end[vb] (vectorised lookups by vbucket id; a vbucket
    without an entry is not limited on that side)."""
    vbs, seqnos = _ints(batch.column("vbucket")), _ints(batch.column("seqno"))
    size = int(max(vbs.max(), *ends, *(floors or {0: 0}))) + 1
    caps = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    for vb, end in ends.items():
        caps[vb] = end
    keep = seqnos <= caps[vbs]
    if floors:
        low = np.full(size, -1, dtype=np.int64)
        for vb, floor in floors.items():
            low[vb] = floor
        keep &= seqnos > low[vbs]
    if keep.all():
        return batch
    mask = pa.Array.from_buffers(pa.bool_(), len(keep), [None, pa.py_buffer(np.packbits(keep, bitorder="little"))])
    return batch.filter(mask)


def delivered(batch: pa.RecordBatch, into: dict[int, int]) -> None:
    """Record the highest seqno delivered per vbucket (so a resumed stream repeats nothing)."""
    if batch.num_rows == 0:
        return
    vbs, seqnos = _ints(batch.column("vbucket")), _ints(batch.column("seqno"))
    top = np.full(int(vbs.max()) + 1, -1, dtype=np.int64)
    np.maximum.at(top, vbs, seqnos)
    for vb in np.flatnonzero(top >= 0):
        if top[vb] > into.get(int(vb), -1):
            into[int(vb)] = int(top[vb])


def _ints(array: pa.Array) -> np.ndarray:
    """An integer column without nulls as a numpy view: pyarrow's `to_numpy` goes through its
    pandas conversion layer (importing pandas on first use) even for a zero-copy view."""
    if array.null_count:
        raise ValueError(f"unexpected nulls in a {array.type} column")
    dtype = np.dtype(array.type.to_pandas_dtype())
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _int64s(values: np.ndarray) -> pa.Array:
    """A numpy int64 column as an Arrow array, zero-copy (not a Python list of n ints per batch)."""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _cast(array, typ: pa.DataType):
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array if array.type == typ else array.cast(typ)


def _to_string(values: pa.Array) -> pa.Array:
    """UTF-8 decode; a value that is not UTF-8 decodes with U+FFFD instead of failing the batch."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()],
                        pa.string())


def parse_json(values: pa.Array, struct_type: pa.DataType) -> pa.Array:
    """Parse JSON documents into `struct_type`. Null (deleted) and non-object values become null.

    Fast path: Arrow's newline-delimited JSON reader over the whole batch. A raw newline can only
    be whitespace in JSON text, so it is replaced by a space first; nulls and values that are not
    objects are replaced by `{}` and masked afterwards.
    """
    n = len(values)
    if n == 0:
        return pa.array([], struct_type)
    if values.type != pa.binary():
        values = values.cast(pa.binary())
    # A JSON object starts with "{" after optional whitespace; anything else is not ours to parse.
    is_object = _looks_like_object(values)
    filled = pc.if_else(is_object, values, pa.scalar(b"{}", pa.binary()))
    flat = pc.replace_substring(pc.replace_substring(filled, b"\n", b" "), b"\r", b" ")
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), flat), b"\n")[0].as_buffer()
    schema = pa.schema(list(struct_type))
    try:
        table = pajson.read_json(pa.BufferReader(joined), parse_options=pajson.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False),
            read_options=pajson.ReadOptions(block_size=max(1 << 20, joined.size + 1)))
        if table.num_rows != n:
            raise pa.ArrowInvalid("row count changed")
        struct = pa.StructArray.from_arrays([_cast(table.column(f.name), f.type) for f in struct_type],
                                            fields=list(struct_type), mask=pc.invert(is_object))
        return struct
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return _parse_json_rows(values.to_pylist(), struct_type)


def _looks_like_object(values: pa.Array) -> pa.Array:
    """True where the value is present and its first non-blank byte is `{`."""
    present = pc.is_valid(values)
    text = pc.if_else(present, values, pa.scalar(b"", pa.binary()))
    # Strip JSON whitespace (space, tab, CR, LF) on the left without assuming UTF-8.
    trimmed = pc.replace_substring_regex(text, pattern=rb"^[ \t\r\n]+", replacement=b"")
    return pc.and_(present, pc.starts_with(trimmed, b"{"))


def _parse_json_rows(values: Sequence[bytes | None], struct_type: pa.DataType) -> pa.Array:
    """The slow, forgiving path: json.loads per row, each field coerced to its type or null."""
    rows = []
    for raw in values:
        doc = None
        if raw is not None:
            try:
                doc = json.loads(raw)
            except (ValueError, RecursionError):
                doc = None
        rows.append(_coerce(doc, struct_type) if isinstance(doc, dict) else None)
    return pa.array(rows, struct_type)


def _coerce(value, typ: pa.DataType):
    """A JSON value as `typ` wants it, or None when it cannot be."""
    if value is None:
        return None
    if pa.types.is_struct(typ):
        if not isinstance(value, dict):
            return None
        return {f.name: _coerce(value.get(f.name), f.type) for f in typ}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return [_coerce(v, typ.value_type) for v in value] if isinstance(value, list) else None
    if pa.types.is_map(typ):
        if not isinstance(value, dict):
            return None
        return [(str(k), _coerce(v, typ.item_type)) for k, v in value.items()]
    if pa.types.is_string(typ):
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if pa.types.is_boolean(typ):
        return value if isinstance(value, bool) else None
    if pa.types.is_integer(typ):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if isinstance(value, float) and not value.is_integer():
            return None
        bits = typ.bit_width
        v = int(value)
        return v if -(1 << (bits - 1)) <= v < (1 << (bits - 1)) else None
    if pa.types.is_floating(typ):
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if pa.types.is_decimal(typ):
        from decimal import Decimal
        return Decimal(str(value)) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if pa.types.is_binary(typ):
        return value.encode() if isinstance(value, str) else None
    try:
        return pa.scalar(value).cast(typ).as_py()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


# ---------------------------------------------------------------------------------------------
# Schema inference from a sample of documents


class _Unknown:
    """A field seen only as JSON null so far."""


def infer_json_schema(samples: Iterable[bytes | None]):
    """Infer a Spark StructType from sampled JSON documents: the union of their fields (sorted, as
    Spark's JSON inference does), integers widened to double when mixed with floats, and any other
    conflict (or a field only ever null) typed as string. Non-object documents are skipped."""
    from pyspark.sql.types import StructType

    merged = None
    for raw in samples:
        if raw is None:
            continue
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict):
            merged = _merge(merged, _type_of(doc))
    if merged is None:
        return StructType([])
    return _to_spark(merged)


def _type_of(value):
    if value is None:
        return _Unknown
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long" if -(1 << 63) <= value < (1 << 63) else "double"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        element = None
        for v in value:
            element = _merge(element, _type_of(v))
        return ("array", element if element is not None else _Unknown)
    return ("struct", {k: _type_of(v) for k, v in value.items()})


def _merge(a, b):
    if a is None or a is _Unknown:
        return b
    if b is None or b is _Unknown:
        return a
    if a == b:
        return a
    if isinstance(a, str) and isinstance(b, str) and {a, b} == {"long", "double"}:
        return "double"
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "array":
        return ("array", _merge(a[1], b[1]))
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "struct":
        fields = dict(a[1])
        for k, v in b[1].items():
            fields[k] = _merge(fields.get(k), v)
        return ("struct", fields)
    return "string"


def _to_spark(t):
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    if t is _Unknown or t is None or t == "string":
        return StringType()
    if t == "boolean":
        return BooleanType()
    if t == "long":
        return LongType()
    if t == "double":
        return DoubleType()
    if t[0] == "array":
        return ArrayType(_to_spark(t[1]), True)
    return StructType([StructField(k, _to_spark(v), True) for k, v in sorted(t[1].items())])
