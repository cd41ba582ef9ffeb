"""Value decoding and batch conversion (no Spark session: pure Arrow)."""

import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from dcpflow.spark.schema import (
    BatchConverter,
    cap_seqnos,
    delivered,
    infer_json_schema,
    parse_json,
    schema_ddl,
    type_ddl,
    value_ddl,
)

DOC = pa.struct([("name", pa.string()), ("age", pa.int64()), ("tags", pa.list_(pa.string()))])


def reference(raw, struct):
    """What parse_json must give for one value, by json.loads."""
    try:
        doc = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    out = {}
    for f in struct:
        v = doc.get(f.name)
        if f.name == "age":
            v = v if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**63 else None
        elif f.name == "name":
            v = v if isinstance(v, str) else (None if v is None else json.dumps(v, separators=(",", ":")))
        elif f.name == "tags":
            v = [t if isinstance(t, str) or t is None else json.dumps(t, separators=(",", ":")) for t in v] \
                if isinstance(v, list) else None
        out[f.name] = v
    return out


json_values = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.text(max_size=8))
docs = st.fixed_dictionaries({}, optional={"name": json_values, "age": json_values,
                                           "tags": st.lists(st.text(max_size=4), max_size=3), "other": json_values})
raw_values = st.one_of(
    st.none(),
    docs.map(lambda d: json.dumps(d).encode()),
    docs.map(lambda d: json.dumps(d, indent=2).encode()),  # newlines inside the document
    st.sampled_from([b"[1, 2]", b"42", b"not json", b"\xff\xfe", b"", b'  {"name": "x"}']),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(raw_values, max_size=20))
def test_parse_json_agrees_with_json_loads(values):
    got = parse_json(pa.array(values, pa.binary()), DOC).to_pylist()
    assert got == [reference(v, DOC) for v in values]


def test_infer_json_schema_merges_kinds():
    samples = [b'{"type": "user", "age": 3, "address": {"city": "Lyon"}}',
               b'{"type": "order", "total": 9.5, "age": 2.5, "items": [{"sku": "a", "qty": 1}]}',
               b'{"type": "order", "items": [{"sku": "b", "price": 1.5}], "odd": 1}',
               b'{"odd": "x", "empty": null}', b"[1]", None, b"not json"]
    inferred = infer_json_schema(samples)
    item = StructType([StructField("price", DoubleType()), StructField("qty", LongType()),
                       StructField("sku", StringType())])
    assert inferred == StructType([
        StructField("address", StructType([StructField("city", StringType())])),
        StructField("age", DoubleType()), StructField("empty", StringType()),
        StructField("items", ArrayType(item)), StructField("odd", StringType()),
        StructField("total", DoubleType()), StructField("type", StringType())])
    assert type_ddl(StructType([StructField("a b`", LongType())])) == "STRUCT<`a b```: BIGINT>"
    assert value_ddl("json", "a INT") == "STRUCT<a INT>" and value_ddl("string") == "STRING"


def spark_schema(value_type=None, key_type=None):
    # The same columns schema_ddl describes, built without a JVM to get the Arrow target.
    value_type = value_type or BinaryType()
    key_type = key_type or StringType()
    nn = False
    return StructType([
        StructField("vbucket", IntegerType(), nn), StructField("seqno", LongType(), nn),
        StructField("vbuuid", LongType(), nn), StructField("key", key_type, nn),
        StructField("value", value_type, True), StructField("event", StringType(), nn),
        *[StructField(n, LongType(), nn) for n in ("cas", "rev_seqno", "flags", "expiry")],
        StructField("datatype", IntegerType(), nn), StructField("snapshot_start", LongType(), nn),
        StructField("snapshot_end", LongType(), nn), StructField("_change_type", StringType(), nn),
        StructField("_commit_version", LongType(), nn), StructField("scope", StringType(), nn),
        StructField("collection", StringType(), nn), StructField("collection_id", LongType(), nn)])


def client_batch(rows):
    cols = list(zip(*rows, strict=True))
    types = [pa.int32(), pa.int64(), pa.int64(), pa.binary(), pa.binary(), pa.string(), pa.int64(), pa.int64(),
             pa.int64(), pa.int64(), pa.int32(), pa.int64(), pa.int64()]
    names = ["vbucket", "seqno", "vbuuid", "key", "value", "event", "cas", "rev_seqno", "flags", "expiry",
             "datatype", "snapshot_start", "snapshot_end"]
    return pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, types, strict=True)], names=names)


ROWS = [(1, 5, 9, b"k1", b'{"name":"a"}', "mutation", 1, 1, 0, 0, 1, 5, 6),
        (2, 7, 9, b"k2", None, "deletion", 2, 2, 0, 0, 0, 7, 7),
        (1, 6, 9, b"k3", None, "expiration", 3, 1, 0, 0, 0, 5, 6),
        (1, 8, 9, b"k4", b"\xff", "mutation", 3, 1, 0, 0, 0, 8, 8)]


def test_converter_output_matches_the_spark_arrow_schema_exactly():
    target = to_arrow_schema(spark_schema(StringType()), timezone="UTC")
    out = BatchConverter(target, "string", "string").convert(client_batch(ROWS), 42)
    assert out.schema.equals(target)
    assert out.column("_change_type").to_pylist() == ["upsert", "delete", "delete", "upsert"]
    assert set(out.column("_commit_version").to_pylist()) == {42}
    assert out.column("key").to_pylist() == ["k1", "k2", "k3", "k4"]
    assert out.column("value").to_pylist() == ['{"name":"a"}', None, None, "\ufffd"]  # bad UTF-8 replaced
    marker = BatchConverter(target, "string", "string").rollback_marker(3, 77, 42)
    assert marker.schema.equals(target)
    assert marker.to_pylist()[0]["_change_type"] == "rollback" and marker.to_pylist()[0]["vbucket"] == 3


def test_converter_json_and_binary_and_caps():
    target = to_arrow_schema(spark_schema(StructType([StructField("name", StringType())]), BinaryType()),
                             timezone="UTC")
    out = BatchConverter(target, "binary", "json").convert(client_batch(ROWS), 1, ends={1: 6, 2: 100})
    assert out.schema.equals(target)
    assert out.column("key").to_pylist() == [b"k1", b"k2", b"k3"]  # vb 1 seqno 8 > its end 6
    assert out.column("value").to_pylist() == [{"name": "a"}, None, None]
    kept = cap_seqnos(client_batch(ROWS), {9: 1})
    assert kept.num_rows == 4  # vbuckets without an end are not capped


def test_schema_ddl_names_every_column():
    ddl = schema_ddl("binary", "STRING")
    assert ddl.split(", ")[3] == "key BINARY NOT NULL" and "value STRING" in ddl
    assert [c.split()[0] for c in ddl.split(", ")] == [f.name for f in spark_schema()]


def test_caps_and_floors_on_a_sliced_batch():
    # A slice starts inside the Arrow buffers (offset > 0): the numpy views must honour it.
    rows = [(vb, seq, 9, b"k%d" % i, b"{}", "mutation", 1, 1, 0, 0, 1, seq, seq)
            for i, (vb, seq) in enumerate([(0, 1), (1, 2), (1, 3), (2, 4), (1, 5), (2, 6), (0, 7)])]
    batch = client_batch(rows).slice(1)
    kept = cap_seqnos(batch, {1: 3, 0: 100}, {2: 4})
    assert list(zip(kept.column("vbucket").to_pylist(), kept.column("seqno").to_pylist(), strict=True)) == \
        [(1, 2), (1, 3), (2, 6), (0, 7)]
    top: dict[int, int] = {3: 50}
    delivered(batch.slice(2), top)
    assert top == {1: 5, 2: 6, 0: 7, 3: 50}
    assert cap_seqnos(batch, {1: 99}) is batch  # nothing dropped: the batch itself

