"""JSON lines from Arrow batches (batches.SCHEMA), built column by column in Arrow's C++ kernels.

`dcpflow tail` prints one JSON object per change. Building a dict and calling json.dumps per event
costs more than reading the change; here a whole batch becomes one buffer of lines: numbers are
cast to text as columns, the pieces of each line are joined element-wise, and the joined column's
data buffer - every line followed by a newline - is written as it is.

A row takes the fast way when what it holds can go into JSON as it is: a key that is UTF-8 with
nothing to escape, and a value flagged JSON (datatype 0x01) on one line. A JSON value is copied
verbatim (the server checked it when it was stored), so its spacing is the writer's. Any other
row (binary values, keys to escape, multi-line JSON) is formatted by `row_json` in Python, which
is also the format's definition.
"""

import base64
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


def _value(value: bytes, datatype: int):
    if datatype & 0x01:
        try:
            return json.loads(value)
        except ValueError:
            pass
    return _text(value)


def row_json(event: str, vbucket: int, seqno: int, key: bytes, value: bytes | None, cas: int, rev_seqno: int,
             flags: int, expiry: int, datatype: int, collection_id: int, delete_time: int, scope: str,
             collection: str) -> dict:
    """One change as tail's JSON object (cas unsigned)."""
    doc = {"event": event, "vbucket": vbucket, "seqno": seqno, "key": _text(key)}
    if event == "mutation":
        doc.update(value=_value(value or b"", datatype), cas=cas, rev_seqno=rev_seqno, flags=flags, expiry=expiry,
                   datatype=datatype)
    else:
        doc.update(cas=cas, rev_seqno=rev_seqno, delete_time=delete_time)
    doc.update(collection_id=collection_id, scope=scope, collection=collection)
    return doc


def _s(arr: pa.Array) -> pa.Array:
    return pc.cast(arr, pa.string())


def _as_text(arr: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(arr as string with invalid UTF-8 rows null, the rows that were valid)."""
    try:
        return pc.cast(arr, pa.string()), None
    except pa.ArrowInvalid:
        ok = pa.array([_valid_utf8(b) for b in arr.to_pylist()], pa.bool_())
        return pc.cast(pc.if_else(ok, arr, pa.scalar(b"", pa.binary())), pa.string()), ok


def _valid_utf8(b) -> bool:
    if b is None:
        return True
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def format_batch(batch: pa.RecordBatch, names) -> memoryview:
    """The batch's rows as JSON lines (each ends with a newline). `names(cid)` -> (scope,
    collection) names of a collection id."""
    n = batch.num_rows
    if not n:
        return memoryview(b"")
    col = batch.column
    event = col(batch.schema.get_field_index("event"))
    key, ok_key = _as_text(col(batch.schema.get_field_index("key")))
    value = col(batch.schema.get_field_index("value"))
    datatype = col(batch.schema.get_field_index("datatype"))
    cid = col(batch.schema.get_field_index("collection_id"))
    is_mut = pc.equal(event, "mutation")
    # which rows can go as they are
    fast = pc.invert(pc.match_substring_regex(key, _NEEDS_ESCAPE))
    if ok_key is not None:
        fast = pc.and_(fast, ok_key)
    vtext, ok_value = _as_text(pc.fill_null(value, b""))
    json_value = pc.and_(pc.not_equal(pc.bit_wise_and(datatype, 1), 0),
                         pc.invert(pc.match_substring_regex(vtext, "[\r\n]")))
    json_value = pc.and_(json_value, pc.greater(pc.binary_length(vtext), 0))
    if ok_value is not None:
        json_value = pc.and_(json_value, ok_value)
    fast = pc.and_(fast, pc.or_(pc.invert(is_mut), json_value))
    # collection names: a few distinct ids per batch
    uniq = pc.unique(cid)
    pairs = [names(int(c)) for c in uniq.to_pylist()]
    where = pc.index_in(cid, value_set=uniq)
    scope = pc.take(pa.array([json.dumps(p[0]) for p in pairs], pa.string()), where)
    coll = pc.take(pa.array([json.dumps(p[1]) for p in pairs], pa.string()), where)
    cas = _s(col(batch.schema.get_field_index("cas")).view(pa.uint64()))
    common_head = ['{"event":"', event, '","vbucket":', _s(col(0)), ',"seqno":',
                   _s(col(batch.schema.get_field_index("seqno"))), ',"key":"', key, '"']
    tail = [',"collection_id":', _s(cid), ',"scope":', scope, ',"collection":', coll, "}\n"]
    mut = pc.binary_join_element_wise(
        *common_head, ',"value":', vtext, ',"cas":', cas, ',"rev_seqno":',
        _s(col(batch.schema.get_field_index("rev_seqno"))), ',"flags":', _s(col(batch.schema.get_field_index("flags"))),
        ',"expiry":', _s(col(batch.schema.get_field_index("expiry"))), ',"datatype":', _s(datatype), *tail, "")
    other = pc.binary_join_element_wise(
        *common_head, ',"cas":', cas, ',"rev_seqno":', _s(col(batch.schema.get_field_index("rev_seqno"))),
        ',"delete_time":', _s(col(batch.schema.get_field_index("delete_time"))), *tail, "")
    lines = pc.if_else(is_mut, mut, other)
    slow = pc.invert(fast)
    if pc.any(slow).as_py():
        idx = pc.indices_nonzero(slow).to_pylist()
        rows = batch.take(pa.array(idx)).to_pylist()
        text = []
        for r in rows:
            scope_name, coll_name = names(r["collection_id"])
            doc = row_json(r["event"], r["vbucket"], r["seqno"], r["key"], r["value"], r["cas"] & 0xFFFFFFFFFFFFFFFF,
                           r["rev_seqno"], r["flags"], r["expiry"], r["datatype"], r["collection_id"],
                           r["delete_time"], scope_name, coll_name)
            text.append(json.dumps(doc, separators=(",", ":")) + "\n")
        lines = pc.replace_with_mask(lines, slow, pa.array(text, pa.string()))
    return _data(lines)


def _data(lines: pa.Array) -> memoryview:
    """The concatenated text of a string array without nulls: its data buffer between the first
    and last offsets (no copy)."""
    off = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
    return memoryview(lines.buffers()[2])[int(off[0]):int(off[-1])]
