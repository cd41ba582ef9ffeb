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


def _join(parts: list) -> pa.Array:
    """binary_join_element_wise over `parts` (arrays and str constants), adjacent constants merged
    first: every argument is a pass over the rows."""
    merged: list = []
    for p in parts:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    return pc.binary_join_element_wise(*merged, "")


#: bytes after which a key needs the full check (_printable_key): control characters, DEL, the
#: quote and the backslash, and every non-ASCII byte; and bytes that keep a value off one line
_KEY_SUSPECT = np.zeros(256, dtype=bool)
_KEY_SUSPECT[:0x20] = _KEY_SUSPECT[0x7F:] = _KEY_SUSPECT[ord('"')] = _KEY_SUSPECT[ord("\\")] = True
_MULTI_LINE = np.zeros(256, dtype=bool)
_MULTI_LINE[ord("\n")] = _MULTI_LINE[ord("\r")] = True


def _none_of(arr: pa.Array, table: np.ndarray) -> bool:
    """Does no byte of a string array's data fall in `table`? One numpy pass over the data - the
    common answer (yes) spares the per-row kernels."""
    bufs = arr.buffers()
    if bufs[2] is None or not len(arr):
        return True
    off = np.frombuffer(bufs[1], dtype=np.int32)[arr.offset:arr.offset + len(arr) + 1]
    return not table[np.frombuffer(bufs[2], dtype=np.uint8)[int(off[0]):int(off[-1])]].any()


def _printable_key(key: pa.Array) -> pa.Array:
    """Keys that go into a JSON string as they are: printable (no control characters) and
    without a quote or a backslash."""
    ok = pc.utf8_is_printable(key)
    for c in ('"', "\\"):
        ok = pc.and_(ok, pc.invert(pc.match_substring(key, c)))
    return ok


def format_batch(batch: pa.RecordBatch, names) -> memoryview:
    """The batch's rows as JSON lines (each ends with a newline). `names(cid)` -> (scope,
    collection) names of a collection id."""
    n = batch.num_rows
    if not n:
        return memoryview(b"")
    col = batch.column
    index = batch.schema.get_field_index

    def num(name: str) -> pa.Array | str:
        """A number column as text, or one str when every row has the same number (flags, expiry
        and datatype mostly do): a constant merges with its neighbours, one pass fewer in _join."""
        arr = col(index(name))
        lo_hi = pc.min_max(arr)
        lo = lo_hi["min"].as_py()
        if lo is not None and lo == lo_hi["max"].as_py():
            return str(lo)
        return pc.cast(arr, pa.string())

    event = col(index("event"))
    key, ok_key = _as_text(col(index("key")))
    value = col(index("value"))
    datatype = col(index("datatype"))
    cid = col(index("collection_id"))
    is_mut = pc.equal(event, "mutation")
    all_mut = pc.all(is_mut).as_py()
    # which rows can go as they are (printable ASCII keys and one-line values: checked whole first)
    fast = pa.repeat(True, n) if _none_of(key, _KEY_SUSPECT) else _printable_key(key)
    if ok_key is not None:
        fast = pc.and_(fast, ok_key)
    vtext, ok_value = _as_text(pc.fill_null(value, b""))
    json_value = pc.and_(pc.not_equal(pc.bit_wise_and(datatype, 1), 0), pc.greater(pc.binary_length(vtext), 0))
    if not _none_of(vtext, _MULTI_LINE):
        for c in ("\n", "\r"):
            json_value = pc.and_(json_value, pc.invert(pc.match_substring(vtext, c)))
    if ok_value is not None:
        json_value = pc.and_(json_value, ok_value)
    fast = pc.and_(fast, json_value if all_mut else pc.or_(pc.invert(is_mut), json_value))
    # collection names: a few distinct ids per batch, often one
    uniq = pc.unique(cid)
    pairs = [names(int(c)) for c in uniq.to_pylist()]
    if len(pairs) == 1:
        scope, coll = json.dumps(pairs[0][0]), json.dumps(pairs[0][1])
    else:
        where = pc.index_in(cid, value_set=uniq)
        scope = pc.take(pa.array([json.dumps(p[0]) for p in pairs], pa.string()), where)
        coll = pc.take(pa.array([json.dumps(p[1]) for p in pairs], pa.string()), where)
    cas = pc.cast(col(index("cas")).view(pa.uint64()), pa.string())
    head = ['{"event":"', event, '","vbucket":', num("vbucket"), ',"seqno":', num("seqno"), ',"key":"', key, '"']
    tail = [',"collection_id":', str(uniq[0].as_py()) if len(uniq) == 1 else pc.cast(cid, pa.string()),
            ',"scope":', scope, ',"collection":', coll, "}\n"]
    rev = num("rev_seqno")
    lines = _join([*head, ',"value":', vtext, ',"cas":', cas, ',"rev_seqno":', rev, ',"flags":', num("flags"),
                   ',"expiry":', num("expiry"), ',"datatype":', num("datatype"), *tail])
    if not all_mut:
        other = _join([*head, ',"cas":', cas, ',"rev_seqno":', rev, ',"delete_time":', num("delete_time"), *tail])
        lines = pc.if_else(is_mut, lines, other)
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
