"""The flusher's rows: store._encoded_rows (compiled in engine/_speedups.c when built) against
store._encoded_rows_py, its specification: the same rows, with the same types, or the same error,
for any items."""

import os
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.engine import store as store_mod
from dcpflow.engine.item import DeleteSource, Item
from dcpflow.engine.store_rows import FLUSH_DCP, FLUSH_SEQNO, FlushRow
from dcpflow.protocol import dcp as dcpproto


def test_the_compiled_rows_are_built():
    """CI builds them: a missing build must not pass unnoticed as a slower flusher."""
    if os.environ.get("DCPFLOW_PURE_PYTHON"):
        assert store_mod._encoded_rows_c is None
    else:
        assert store_mod._encoded_rows_c is not None, "dcpflow.engine._speedups did not build: needs gcc"


needs_rows = pytest.mark.skipif(store_mod._encoded_rows_c is None, reason="the compiled rows are not built")
u64s = st.one_of(st.integers(0, 5), st.integers(0, (1 << 64) - 1), st.sampled_from([(1 << 63) - 1, 1 << 63]))
wide = st.one_of(u64s, st.integers(-3, -1), st.just(1 << 64), st.integers(0, (1 << 32) + 2))
values_around_large = st.one_of(st.binary(max_size=64),  # LARGE_VALUE and ENCODED_VALUE_LIMIT
                                st.sampled_from([2047, 2048, 2049, 8191, 8192, 8193]).map(bytes))
items = st.builds(
    Item, key=st.binary(min_size=1, max_size=300), value=values_around_large,
    flags=wide, expiry=wide, cas=wide, rev_seqno=wide, by_seqno=wide, datatype=st.one_of(st.integers(0, 7), wide),
    deleted=st.booleans(), delete_time=st.integers(0, 1 << 40),
    delete_source=st.sampled_from([DeleteSource.EXPLICIT, DeleteSource.TTL]),
    cid=st.one_of(st.just(0), st.integers(1, 9), st.sampled_from([0xFFFFFFFF, 1 << 32, -1])))


def _row_outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 - the twins must fail alike, whatever the error
        return ("error", type(e).__name__, str(e))


@needs_rows
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vb=st.one_of(st.integers(0, 1023), st.just(70000)), batch=st.lists(items, max_size=8))
def test_compiled_rows_equal_their_specification(vb, batch):
    compiled = _row_outcome(store_mod._encoded_rows, vb, batch)
    python = _row_outcome(store_mod._encoded_rows_py, vb, batch)
    assert compiled == python
    if compiled[0] == "ok":  # the same types too: SQLite binds a bytearray and bytes differently
        for c_row, py_row in zip(compiled[1], python[1], strict=True):
            assert [type(v) for v in c_row] == [type(v) for v in py_row]


@needs_rows
def test_rows_of_a_plain_mutation_carry_its_dcp_message():
    it = Item(b"key", b"value", 0x01020304, 0, 0x1122334455667788, 9, 42, 1)
    (row,) = store_mod._encoded_rows(3, [it])
    assert row[12] == dcpproto.DcpMutation(3, 42, 9, 0x01020304, 0, 0, b"key", b"value", 0x1122334455667788, 1,
                                           0).encode()
    assert row[:12] == (3, bytearray(b"key"), 42, 9, 0x1122334455667788, 0x01020304, 0, 1, 0, 0, 0,
                        bytearray())  # the value lives in the message
    deleted = Item(b"key", b"", cas=1, by_seqno=43, deleted=True)
    assert store_mod._encoded_rows(3, [deleted])[0][11:] == (bytearray(), None, 0)
    # another collection's plain mutation is read as a row: a stored message has no collection prefix
    named = Item(b"key", b"value", 0x01020304, 0, 0x1122334455667788, 9, 44, 1, cid=8)
    assert store_mod._encoded_rows(3, [named])[0][11:] == (bytearray(b"value"), None, 8)


@needs_rows
@pytest.mark.parametrize("field, value", [
    ("flags", 1 << 32), ("expiry", 1 << 32), ("datatype", 256), ("datatype", -1), ("cas", 1 << 64), ("cas", -1),
    ("rev_seqno", 1 << 64), ("by_seqno", 1 << 63), ("key", b"k" * 65535), ("vb", 1 << 16)])
def test_one_field_out_of_range_fails_alike(field, value):
    """A plain mutation with one field that does not fit its column or the DCP head."""
    vb = value if field == "vb" else 5
    fields = {"key": b"key", "value": b"v", "flags": 1, "expiry": 2, "cas": 3, "rev_seqno": 4, "by_seqno": 5,
              "datatype": 0}
    if field != "vb":
        fields[field] = value
    batch = [Item(**fields)]
    assert _row_outcome(store_mod._encoded_rows, vb, batch) == _row_outcome(store_mod._encoded_rows_py, vb, batch)


@needs_rows
def test_an_object_that_is_not_a_document_is_left_to_the_python_row():
    """The compiled rows read Documents (the protocol's record, which Item is) from their slots;
    anything else with the same attributes is built by _encoded_row, through its attributes."""
    fields = {"key": b"key", "value": b"v", "flags": 1, "expiry": 2, "cas": 3, "rev_seqno": 4, "by_seqno": 5,
              "datatype": 0, "deleted": False, "delete_time": 0, "delete_source": DeleteSource.EXPLICIT, "cid": 0}
    seen = []

    def row_py(vb, it):
        seen.append(it)
        return store_mod._encoded_row(vb, it)

    other = SimpleNamespace(**fields)
    rows = store_mod._encoded_rows_c(5, [Item(**fields), other], row_py)
    assert seen == [other]
    assert rows[0] == rows[1] == store_mod._encoded_row(5, Item(**fields))


@pytest.mark.parametrize("build", ["python", "compiled"])
def test_the_flushers_rows_are_flush_rows_field_by_field(build):
    """store_rows.FlushRow is the layout the items table's upsert is made from; both builders'
    rows - the compiled one's too, whose C code numbers its own slots - read by its field names
    give back each field of the item."""
    if build == "compiled" and store_mod._encoded_rows_c is None:
        pytest.skip("the compiled rows are not built")
    rows = store_mod._encoded_rows if build == "compiled" else store_mod._encoded_rows_py
    plain = Item(b"key", b"value", 0x01020304, 7, (1 << 63) + 2, 9, 42, 1)
    gone = Item(b"gone", b"", cas=5, rev_seqno=3, by_seqno=43, deleted=True, delete_time=99,
                delete_source=DeleteSource.TTL, cid=8)
    for it, row in zip((plain, gone), rows(3, [plain, gone]), strict=True):
        assert len(row) == len(FlushRow._fields)
        r = FlushRow._make(row)
        assert (r.vb, r.key, r.seqno, r.flags, r.expiry, r.datatype, r.cid) == \
            (3, it.key, it.by_seqno, it.flags, it.expiry, it.datatype, it.cid)
        assert (r.rev_seqno % (1 << 64), r.cas % (1 << 64)) == (it.rev_seqno, it.cas)  # signed 64-bit
        assert (bool(r.deleted), r.delete_time, r.delete_source) == (it.deleted, it.delete_time, int(it.delete_source))
        assert (row[FLUSH_SEQNO], row[FLUSH_DCP]) == (r.seqno, r.dcp)
    p_row, g_row = (FlushRow._make(r) for r in rows(3, [plain, gone]))
    assert p_row.value == bytearray() and bytes(p_row.dcp).endswith(b"keyvalue")  # the message ends with key, value
    assert g_row.value == bytearray() and g_row.dcp is None
