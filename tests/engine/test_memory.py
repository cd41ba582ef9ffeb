"""The bucket memory quota (engine/memory.py): accounting, value eviction of clean items, reads that
fetch evicted values back, ETMPFAIL / ENOMEM near the quota, the checkpoint quota and its cursor
dropping, and a warm-up that keeps to the quota."""

import random
import tracemalloc

import pytest

from dcpflow.engine import VBucketState
from dcpflow.engine.checkpoint import CheckpointManager
from dcpflow.engine.errors import EngineError
from dcpflow.engine.hashtable import HashTable
from dcpflow.engine.item import ITEM_OVERHEAD, NOT_RESIDENT
from dcpflow.engine.memory import (
    CHECKPOINT_MEMORY_RATIO,
    HT_ITEM_OVERHEAD,
    MAX_CHECKPOINTS,
    MEM_HIGH_WAT,
    MEM_LOW_WAT,
    MUTATION_MEM_THRESHOLD,
    BucketMemory,
)
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.status import Status

MiB = 1024 * 1024
VALUE = b"v" * 4096


def active(bucket):
    bucket.create_vbuckets(range(bucket.num_vbuckets), VBucketState.ACTIVE)
    return bucket


def vb_of(bucket, key: bytes):
    return bucket.vbucket(vbucket_for_key(key, bucket.num_vbuckets))


def recount(bucket) -> tuple[int, int, int]:
    """(values, meta, checkpoint) counted from scratch: what the running counters must equal."""
    values = meta = checkpoint = 0
    for vb in bucket.vbuckets.values():
        for item in vb.ht.values():
            meta += len(item.key) + HT_ITEM_OVERHEAD
            values += len(item.value)
        checkpoint += vb.checkpoint_manager.mem_usage
    return values, meta, checkpoint


def counters(bucket) -> tuple[int, int, int]:
    m = bucket.memory
    return m.values, m.meta, m.checkpoint


def fill_until_refused(bucket, prefix: str = "k", value: bytes = VALUE, limit: int = 100_000,
                       flush: bool = False) -> tuple[int, EngineError]:
    """Writes until one is refused; with `flush` the flusher keeps up (a batch after every write)."""
    for i in range(limit):
        key = f"{prefix}{i}".encode()
        try:
            vb_of(bucket, key).set(key, value)
        except EngineError as e:
            return i, e
        if flush:
            bucket.flush()
    raise AssertionError("never refused")


def test_the_marks_are_kv_engines_fractions_of_the_quota():
    m = BucketMemory(100 * MiB)
    assert (m.high_wat, m.low_wat, m.mutation_limit) == (100 * MiB * MEM_HIGH_WAT, 100 * MiB * MEM_LOW_WAT,
                                                         100 * MiB * MUTATION_MEM_THRESHOLD)
    assert m.checkpoint_quota == 100 * MiB * CHECKPOINT_MEMORY_RATIO == 30 * MiB
    assert (m.checkpoint_upper, m.checkpoint_lower) == (27 * MiB, 18 * MiB)
    assert m.checkpoint_max_bytes(1024) == 30 * MiB / 10240  # 3 KiB: no floor (see the next test)
    assert m.checkpoint_max_bytes(4) == 30 * MiB / 40
    unlimited = BucketMemory()
    assert not unlimited.refuses_writes() and unlimited.checkpoint_max_bytes(4) == float("inf")
    with pytest.raises(ValueError):
        BucketMemory(0)


def test_writes_are_refused_until_flushed_values_are_evicted_and_reads_fetch_them_back(make_bucket):
    bucket = active(make_bucket(memory_quota=4 * MiB, checkpoint_max_items=50))
    n, refused = fill_until_refused(bucket, flush=True)  # the flusher keeps up; nobody runs the pager
    assert refused.status == Status.ETMPFAIL and "evicted" in refused.reason
    assert bucket.memory.used > bucket.memory.mutation_limit and n > 100
    assert counters(bucket) == recount(bucket)
    assert bucket.pager.wanted()
    freed, done = 0, False
    while not done:
        step, done = bucket.evict(budget=64)  # small passes: the owner's loop runs between them
        freed += step
    assert freed > 0 and bucket.memory.used <= bucket.memory.low_wat
    assert counters(bucket) == recount(bucket)
    evicted = [(vb, k) for vb in bucket.vbuckets.values() for k, it in vb.ht.items() if it.value is NOT_RESIDENT]
    assert evicted and bucket.memory.num_value_evictions == len(evicted)
    vb, key = evicted[0]
    assert vb.get(key).value == VALUE  # fetched back from the store, resident again
    assert vb.ht[key].value == VALUE and bucket.memory.num_bg_fetches == 1
    assert counters(bucket) == recount(bucket)
    more, _ = fill_until_refused(bucket, prefix="again", flush=True)  # room again: writes go on
    assert more > 50


def test_every_operation_that_reads_an_evicted_value_fetches_it(make_bucket, clock):
    bucket = active(make_bucket(memory_quota=64 * MiB, clock=clock))
    vb = bucket.vbucket(0)
    xattrs = (b"\x00\x00\x00\x13" + b"\x00\x00\x00\x0f_sys\x00{\"a\":1}\x00")  # one system xattr, then the body
    vb.set(b"counter", b"41")
    vb.set(b"text", b"hello")
    vb.set(b"touchme", b"abc")
    vb.set(b"lockme", b"secret")
    vb.set(b"xattr", xattrs + b"{}", datatype=0x05)
    vb.set(b"expiring", b"x", expiry=10)
    bucket.flush_all()
    for key, item in list(vb.ht.items()):  # evict them all, as the pager would
        vb.ht[key] = type(item)(key, NOT_RESIDENT, item.flags, item.expiry, item.cas, item.rev_seqno, item.by_seqno,
                                item.datatype)
        bucket.memory.values -= len(item.value)
    assert vb.writable(b"counter").value == b"41"
    assert vb.writable(b"text").value == b"hello"
    assert vb.touch(b"touchme", 100).value == b"abc"
    assert vb.get_locked(b"lockme", 15).value == b"secret"
    tomb = vb.delete(b"xattr")
    assert tomb.value.startswith(b"\x00\x00\x00\x13") and tomb.datatype == 0x04  # the system xattr stays
    clock.advance(20)
    assert vb.expire_due() == 1 and vb.ht[b"expiring"].deleted
    assert counters(bucket) == recount(bucket)


def test_restore_takes_the_value_from_disk_and_the_metadata_from_memory(make_bucket):
    bucket = active(make_bucket(memory_quota=64 * MiB))
    vb = bucket.vbucket(1)
    vb.set(b"k", b"value")
    bucket.flush_all()
    item = vb.ht[b"k"]
    vb.ht[b"k"] = type(item)(b"k", NOT_RESIDENT, item.flags, item.expiry, item.cas, item.rev_seqno, item.by_seqno,
                             item.datatype)
    bucket.memory.values -= 5
    assert vb.get(b"k", fetch=False).value is NOT_RESIDENT  # the server fetches off the loop
    locked = vb.get_locked(b"k", 15)  # a new CAS in memory only
    stored = bucket.store.read(1, b"k")
    assert stored.cas != locked.cas
    vb.ht[b"k"] = type(item)(b"k", NOT_RESIDENT, locked.flags, locked.expiry, locked.cas, locked.rev_seqno,
                             locked.by_seqno, locked.datatype)
    bucket.memory.values -= 5
    restored = vb.restore(b"k", stored)
    assert restored.value == b"value" and restored.cas == locked.cas
    assert counters(bucket) == recount(bucket)
    vb.set(b"k", b"newer", cas=locked.cas)
    with pytest.raises(EngineError) as e:  # a fetch that raced with a newer write of another evicted version
        bucket.vbucket(1).ht[b"k"] = type(item)(b"k", NOT_RESIDENT, 0, 0, 1, 9, 999, 0)
        vb.restore(b"k", stored)
    assert e.value.status == Status.ETMPFAIL


def test_keys_and_metadata_alone_over_the_threshold_is_enomem(make_bucket):
    bucket = active(make_bucket(memory_quota=2 * MiB))
    n, refused = fill_until_refused(bucket, value=b"", limit=100_000, flush=True)
    assert refused.status == Status.ENOMEM and "raise the quota" in refused.reason
    assert bucket.memory.num_oom == 1
    with pytest.raises(EngineError) as e:
        bucket.vbucket(0).add(b"another", b"")
    assert e.value.status == Status.ENOMEM
    bucket.vbucket(vbucket_for_key(b"k0", 4)).delete(b"k0")  # deletions are never refused


def test_checkpoint_memory_over_its_quota_is_etmpfail_while_the_flusher_lags(make_bucket):
    """Checkpoints may hold 30% of the quota: writes the flusher has not taken stay there (the
    persistence cursor pins them), so a lagging flusher bounds what is acknowledged unpersisted."""
    bucket = active(make_bucket(memory_quota=8 * MiB, checkpoint_max_items=10))
    _, refused = fill_until_refused(bucket)
    assert refused.status == Status.ETMPFAIL and "checkpoint memory is full" in refused.reason
    assert bucket.memory.checkpoint >= bucket.memory.checkpoint_quota
    unpersisted = sum(vb.high_seqno - vb.persisted_seqno for vb in bucket.vbuckets.values())
    assert unpersisted * (len(VALUE) + ITEM_OVERHEAD) <= bucket.memory.checkpoint_quota + 20 * (len(VALUE) + 300)
    bucket.flush_all()
    assert bucket.memory.checkpoint < bucket.memory.checkpoint_lower  # written: released
    bucket.vbucket(0).set(b"after", VALUE)


def test_checkpoint_memory_counts_what_queued_writes_spend(make_bucket):
    """What a write queued for the flusher and DCP costs in Python objects (its Item, key and value,
    CAS, the checkpoint's slots; measured by tracemalloc, as a request makes them) is what checkpoint
    memory counts for it, within 10%: counted at a third less, a flusher's backlog took 1.45x its
    quota's share, and the interpreter kept those pools after the backlog drained."""
    bucket = active(make_bucket(num_vbuckets=1))
    vb = bucket.vbucket(0)
    value = b'{"a":"' + b"x" * 300 + b'"}'
    n = 20_000
    tracemalloc.start()
    try:
        before, counted = tracemalloc.get_traced_memory()[0], bucket.memory.checkpoint
        for i in range(n):
            vb.set(b"doc-%011d" % i, bytes(bytearray(value)), datatype=1)  # new key and value, as a request's
        spent = tracemalloc.get_traced_memory()[0] - before
        # the item table's records of up to 512 bytes come from the same allocator: what the table
        # alone spends on the same documents is the item's resident cost, not the checkpoint's
        table, table_before = HashTable(), tracemalloc.get_traced_memory()[0]
        for it in vb.ht.values():
            table.put(it.key, it.value, it.flags, it.expiry, it.cas,
                      it.rev_seqno, it.by_seqno, it.datatype, it.deleted, it.delete_time, it.delete_source)
        spent -= tracemalloc.get_traced_memory()[0] - table_before
        assert len(table) == n
    finally:
        tracemalloc.stop()
    counted = bucket.memory.checkpoint - counted
    assert 0.9 * spent <= counted <= 1.1 * spent, (spent / n, counted / n)


@pytest.mark.parametrize("quota", [1 * MiB, 100 * MiB, 10 * 1024 * MiB])
@pytest.mark.parametrize("num_vbuckets", [1, 64, 1024, 4096])
def test_open_checkpoints_together_fit_a_tenth_of_the_checkpoint_quota(quota, num_vbuckets):
    """Whatever the vbucket count: every vbucket's open checkpoint at its size limit takes a tenth of
    the checkpoint quota, so the rest, which recovery can release, stays in closed checkpoints.
    (The 64 KiB floor this replaces made 1024 open checkpoints 64 MiB against a 30 MiB quota.)"""
    m = BucketMemory(quota)
    assert num_vbuckets * m.checkpoint_max_bytes(num_vbuckets) == pytest.approx(m.checkpoint_quota / MAX_CHECKPOINTS)
    assert num_vbuckets * m.checkpoint_max_bytes(num_vbuckets) < m.checkpoint_upper - m.checkpoint_lower


def _stalled_cursors(bucket, droppable: bool) -> list:
    """A DCP cursor from seqno 0 on every vbucket that never reads; the names dropped are collected."""
    dropped: list[str] = []
    for vb in bucket.vbuckets.values():
        vb.checkpoint_manager.register_cursor(f"stalled:{vb.id}", 0, droppable=droppable,
                                              on_drop=lambda c: dropped.append(c.name))
    return dropped


@pytest.mark.parametrize("droppable", [False, True], ids=["plain", "cursor-dropping"])
def test_a_stalled_cursor_on_each_of_1024_vbuckets_is_dropped_before_a_write_is_refused(make_bucket, droppable):
    """The defaults (1024 vbuckets, a 100 MiB quota, 30% of it for checkpoints), a cursor on every
    vbucket that never reads, the flusher keeping up, 36,000 distinct 1 KiB documents (more than the
    checkpoint quota holds): no write is refused. Droppable cursors go first; a consumer without
    cursor dropping loses its cursor too (its stream ends SLOW) once nothing else frees enough -
    at the upper mark, before the quota is full. (No age limit on checkpoints: the rule must not
    depend on how long the writes take.)"""
    bucket = active(make_bucket(memory_quota=100 * MiB, num_vbuckets=1024, checkpoint_max_age=None))
    mem = bucket.memory
    dropped = _stalled_cursors(bucket, droppable)
    peak = 0
    value = b"d" * 1024
    for i in range(36_000):
        key = b"doc%05d" % i
        vb_of(bucket, key).set(key, value)  # raises EngineError(ETMPFAIL) if refused
        peak = max(peak, mem.checkpoint)
        if i % 500 == 499:
            bucket.flush_all()  # the flusher keeps up: only the stalled cursors pin checkpoints
    assert dropped and mem.num_cursors_dropped == len(dropped)
    assert peak < mem.checkpoint_quota
    assert counters(bucket) == recount(bucket)


def test_a_stalled_cursor_is_dropped_on_1024_vbuckets_with_the_floor_it_replaces(make_bucket):
    """The same with `max_bytes` forced to the old 64 KiB floor: open checkpoints never fill, yet the
    recovery closes the open checkpoints its cursors have not read and drops them (the open-checkpoint
    rule alone is enough, whatever the size limit)."""
    bucket = active(make_bucket(memory_quota=100 * MiB, num_vbuckets=1024, checkpoint_max_age=None))
    for vb in bucket.vbuckets.values():
        vb.checkpoint_manager.max_bytes = 64 * 1024
    mem = bucket.memory
    dropped = _stalled_cursors(bucket, droppable=True)
    value = b"d" * 1024
    for i in range(36_000):
        key = b"doc%05d" % i
        vb_of(bucket, key).set(key, value)
        if i % 500 == 499:
            bucket.flush_all()
    assert dropped
    assert mem.checkpoint < mem.checkpoint_quota


def test_recovery_closes_a_full_open_checkpoint_the_next_write_would_have_closed(make_bucket):
    """An open checkpoint past its size stays open until its vbucket's next write; recovery closes
    it (kv_engine's maybeCreateNewCheckpoint), so a cursor that has not read it becomes droppable."""
    bucket = active(make_bucket(memory_quota=64 * MiB))
    vb = bucket.vbucket(0)
    cm = vb.checkpoint_manager
    cm.max_bytes = 2 * len(VALUE)
    cursor = cm.register_cursor("stalled", 0, droppable=True).cursor
    keys = [k for k in (f"f{i}".encode() for i in range(400)) if vbucket_for_key(k, 4) == 0][:2]
    for key in keys:
        vb.set(key, VALUE)
    bucket.flush_all()
    full = cm.open_checkpoint
    assert full.mem_usage >= cm.max_bytes and len(cm.checkpoints) == 1
    assert cm.release_for_memory(lambda: True) == 0  # the cursor is in the open checkpoint
    assert cm.close_open_if_full()
    assert not full.is_open and cm.open_checkpoint is not full and cursor.checkpoint is full
    assert not cm.close_open_if_full()  # the new one is empty
    assert cm.release_for_memory(lambda: True) == 1 and cursor.dropped
    assert cm.checkpoints == [cm.open_checkpoint] and cm.mem_usage == 0  # what only the cursor pinned is released
    assert counters(bucket) == recount(bucket)


def test_recovery_visits_only_vbuckets_with_dcp_cursors_to_drop(make_bucket, monkeypatch):
    """Checkpoint memory over the upper mark, pinned by the persistence cursor alone (the flusher is
    behind; no DCP stream): the cursor-dropping steps of recovery have nothing to drop in any
    vbucket, so they visit none (under a write storm, recovery walked all 1,024 managers three times
    each time it ran: most of the event loop's time per write); a vbucket with a stalled DCP cursor
    is still visited and its cursor dropped."""
    bucket = active(make_bucket(memory_quota=8 * MiB, num_vbuckets=64))
    mem = bucket.memory
    visited = []
    release = CheckpointManager.release_for_memory
    monkeypatch.setattr(CheckpointManager, "release_for_memory",
                        lambda cm, *a, **k: visited.append(cm) or release(cm, *a, **k))
    for i in range(400):
        vb_of(bucket, b"p%d" % i).set(b"p%d" % i, VALUE)
    mem.checkpoint_upper = mem.checkpoint_lower = 1  # over the marks: recovery runs every step it has
    bucket.recover_checkpoint_memory()
    assert visited == [] and mem.checkpoint > 1
    cm = bucket.vbucket(3).checkpoint_manager
    stalled = cm.register_cursor("stalled", 0, droppable=True).cursor
    bucket.flush_all()
    for i in range(400, 800):
        vb_of(bucket, b"p%d" % i).set(b"p%d" % i, VALUE)
    bucket.flush_all()
    bucket.recover_checkpoint_memory()
    assert visited and set(visited) == {cm} and stalled.dropped
    assert counters(bucket) == recount(bucket)


def test_release_for_memory_closes_the_open_checkpoint_a_cursor_has_not_read_only_when_asked(make_bucket):
    """A cursor inside the open checkpoint pins nothing dropping it would release; `close_open`
    closes that checkpoint first - only once the flusher has read it (else it pins it anyway), and
    only for cursors of the kind being dropped."""
    bucket = active(make_bucket(memory_quota=64 * MiB))
    vb = bucket.vbucket(0)
    cm = vb.checkpoint_manager
    plain = cm.register_cursor("plain", 0, droppable=False).cursor
    keys = [k for k in (f"o{i}".encode() for i in range(400)) if vbucket_for_key(k, 4) == 0][:3]
    for key in keys:
        vb.set(key, VALUE)
    assert len(cm.checkpoints) == 1
    assert cm.release_for_memory(lambda: True, close_open=True) == 0  # the flusher has not read it
    assert len(cm.checkpoints) == 1
    bucket.flush_all()
    assert cm.release_for_memory(lambda: True) == 0  # in the open checkpoint: not a candidate
    assert cm.release_for_memory(lambda: True, close_open=True) == 0  # not droppable
    assert len(cm.checkpoints) == 1
    assert cm.release_for_memory(lambda: True, undroppable=True, close_open=True) == 1
    assert plain.dropped and len(cm.checkpoints) == 1 and cm.mem_usage == 0
    assert counters(bucket) == recount(bucket)


def test_lagging_cursors_are_dropped_over_the_checkpoint_upper_mark(make_bucket):
    """Bucket-wide: the opted-in (droppable) cursor goes at the upper mark; one that did not opt in
    keeps its place while dropping the others frees enough, then goes too (its owner ends its stream
    SLOW), also at the upper mark: no write is refused meanwhile, the flusher keeping up. Memory
    comes back below the lower mark each time."""
    bucket = active(make_bucket(memory_quota=8 * MiB, checkpoint_max_items=5))
    dropped: list[str] = []
    plain = []
    for vbid in range(4):
        cm = bucket.vbucket(vbid).checkpoint_manager
        cm.register_cursor(f"opted-in:{vbid}", 0, droppable=True, on_drop=lambda c: dropped.append(c.name))
        plain.append(cm.register_cursor(f"plain:{vbid}", 0, droppable=False,
                                        on_drop=lambda c: dropped.append(c.name)).cursor)
    mem = bucket.memory
    i = 0
    while not any(name.startswith("opted-in") for name in dropped):
        key = f"k{i}".encode()
        vb_of(bucket, key).set(key, VALUE)
        bucket.flush()  # the flusher keeps up: only the DCP cursors pin checkpoints
        for cursor in plain:  # the plain consumers keep up too, for now
            cursor.next_batch()
        i += 1
    assert not [n for n in dropped if n.startswith("plain")]
    assert mem.checkpoint < mem.checkpoint_upper
    while not any(name.startswith("plain") for name in dropped):
        key = f"k{i}".encode()
        vb_of(bucket, key).set(key, VALUE)  # never refused: the plain cursors go before the quota is full
        bucket.flush()
        i += 1
        assert i < 20_000
    assert mem.checkpoint <= mem.checkpoint_lower + 2 * (len(VALUE) + 200)
    assert mem.num_cursors_dropped == len(dropped)
    assert counters(bucket) == recount(bucket)


def test_open_checkpoints_read_and_persisted_are_released_when_checkpoints_fill_their_quota(make_bucket):
    """Many vbuckets, a small quota: once the flusher has written the open checkpoints, the recovery
    a refused write starts releases them: writes go on, none is refused forever."""
    bucket = active(make_bucket(memory_quota=8 * MiB, num_vbuckets=64))
    mem = bucket.memory
    written = 0
    for i in range(3000):
        key = f"d{i}".encode()
        try:
            vb_of(bucket, key).set(key, VALUE)
            written += 1
        except EngineError as e:
            assert e.status == Status.ETMPFAIL, e
            bucket.flush_all()
            bucket.evict()
            vb_of(bucket, key).set(key, VALUE)  # room again, at once
            written += 1
    assert written == 3000
    assert mem.checkpoint <= mem.checkpoint_quota + len(VALUE) + 200
    assert counters(bucket) == recount(bucket)


def test_open_checkpoints_close_at_the_buckets_checkpoint_max_size(make_bucket):
    bucket = active(make_bucket(memory_quota=4 * MiB, checkpoint_max_items=10_000))
    cm = bucket.vbucket(0).checkpoint_manager
    assert cm.max_bytes == 4 * MiB * 0.3 / 40
    keys = [k for k in (f"c{i}".encode() for i in range(2000)) if vbucket_for_key(k, 4) == 0][:60]
    for key in keys:
        bucket.vbucket(0).set(key, VALUE)
    assert max(cp.mem_usage for cp in cm.checkpoints) <= cm.max_bytes + len(VALUE) + 200
    assert len(cm.checkpoints) > 1
    bucket.set_memory_quota(None)
    assert cm.max_bytes == float("inf")


def test_warmup_keeps_values_on_disk_past_the_low_watermark(make_bucket, tmp_path):
    bucket = active(make_bucket(memory_quota=None))
    for i in range(2000):
        key = f"w{i}".encode()
        vb_of(bucket, key).set(key, VALUE)
    bucket.close()
    again = make_bucket(memory_quota=4 * MiB)
    mem = again.memory
    evicted = sum(1 for vb in again.vbuckets.values() for it in vb.ht.values() if it.value is NOT_RESIDENT)
    assert 1000 < evicted < 2000
    assert mem.used <= mem.low_wat + evicted * (HT_ITEM_OVERHEAD + 5)  # past the mark only keys and metadata load
    assert counters(again) == recount(again)
    assert sum(vb.num_items for vb in again.vbuckets.values()) == 2000
    assert vb_of(again, b"w1999").get(b"w1999").value == VALUE


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_counters_always_equal_a_recount(make_bucket, clock, seed):
    """Random sets, deletes, expiries, flushes, evictions, fetches, purges and a rollback: the
    running counters never drift from what the hash tables and checkpoints hold."""
    rng = random.Random(seed)
    bucket = active(make_bucket(memory_quota=3 * MiB, clock=clock, checkpoint_max_items=20, purge_interval=0))
    keys = [f"r{i}".encode() for i in range(300)]
    for step in range(3000):
        key = rng.choice(keys)
        vb = vb_of(bucket, key)
        op = rng.random()
        try:
            if op < 0.55:
                vb.set(key, rng.randbytes(rng.randrange(0, 8000)), expiry=rng.choice([0, 0, 0, 5]))
            elif op < 0.7:
                vb.delete(key)
            elif op < 0.8:
                vb.get(key)
            elif op < 0.85:
                clock.advance(3)
                bucket.run_expiry_pager()
            elif op < 0.93:
                bucket.flush()
                bucket.evict(budget=rng.randrange(1, 200))
            elif op < 0.97:
                bucket.flush_all()
                bucket.compact()
            else:
                bucket.flush_all()
                target = rng.randrange(0, vb.high_seqno + 1)
                bucket.rollback(vb.id, target)
        except EngineError as e:
            assert e.status in (Status.KEY_ENOENT, Status.ETMPFAIL, Status.ENOMEM), e
            if e.status != Status.KEY_ENOENT:
                bucket.flush_all()
                bucket.evict()
        assert counters(bucket) == recount(bucket), step


def test_nothing_dirty_is_evicted(make_bucket):
    bucket = active(make_bucket(memory_quota=4 * MiB, checkpoint_max_items=50))
    for i in range(200):
        key = f"d{i}".encode()
        vb_of(bucket, key).set(key, VALUE)
    bucket.set_memory_quota(MiB)  # far over: the pager would evict everything it may
    assert bucket.evict() == (0, True)  # nothing is clean before the flusher has written it
    bucket.flush_all()
    freed, _ = bucket.evict()
    assert freed > 0


def test_with_an_owner_task_a_refused_write_wakes_it_instead_of_recovering_checkpoints_itself(make_bucket):
    """Checkpoints full while the flusher lags: recovering there finds nothing to release, so a
    recovery per refused write only burns the CPU the flusher needs. With an owner task (`on_high`,
    the server's pager task) every refused write wakes it and none recovers inline; the task's one
    recovery frees what the flusher wrote meanwhile. Without one the refused write recovers itself."""
    bucket = active(make_bucket(memory_quota=8 * MiB, checkpoint_max_items=10))
    mem = bucket.memory
    recoveries, wakes = [], []
    mem.on_checkpoint_pressure = lambda: recoveries.append(bucket.recover_checkpoint_memory())
    mem.on_high = lambda: wakes.append(1)
    written, refused = fill_until_refused(bucket)
    assert refused.status == Status.ETMPFAIL and mem.checkpoint >= mem.checkpoint_quota
    inline = len(recoveries)  # the write path's own recoveries at the upper mark (checkpoint_grew)
    for i in range(50):
        with pytest.raises(EngineError) as e:
            vb_of(bucket, b"more%d" % i).set(b"more%d" % i, VALUE)
        assert e.value.status == Status.ETMPFAIL
    assert len(recoveries) == inline and len(wakes) >= 51
    bucket.flush_all()
    bucket.recover_checkpoint_memory()  # what the woken task does
    assert mem.checkpoint < mem.checkpoint_quota
    vb_of(bucket, b"after").set(b"after", VALUE)
    mem.on_high = None  # no owner task: the refused write recovers itself
    fill_until_refused(bucket, prefix="again")
    assert len(recoveries) > inline
    assert counters(bucket) == recount(bucket)


def test_the_pager_does_not_visit_values_it_evicted_on_an_earlier_round(make_bucket):
    """A bucket mostly on disk: the pager's budget goes to the entries still resident, so a small
    pass finds them at once rather than walking past everything it evicted before."""
    bucket = make_bucket(num_vbuckets=1, memory_quota=64 * MiB)
    bucket.create_vbuckets([0], VBucketState.ACTIVE)
    vb = bucket.vbucket(0)
    for i in range(600):
        vb.set(b"old%d" % i, VALUE)
    bucket.flush_all()
    for i in range(600):  # evicted (EVICT_KEY): first in the hash table's order
        assert vb.evict_key(b"old%d" % i) == "Ejected."
    for i in range(100):
        vb.set(b"new%d" % i, VALUE)
    bucket.flush_all()
    bucket.memory.set_quota(int(bucket.memory.used / 0.9))  # over the high watermark: some must go
    assert bucket.pager.wanted()
    freed, _ = bucket.evict(budget=150)
    assert freed > 0 and bucket.memory.num_value_evictions > 600
