"""Compaction by fragmentation (server/app.py): a store whose rows are mostly older versions kept
for rollback is compacted without waiting for the hourly compaction, its history trimmed to a
quarter of the documents, so an overwrite storm cannot grow the file without end. And the
persistence backlog a write storm can build is bounded by the checkpoint quota."""

import time

import pytest

from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server import app, background
from tests.resources import wait_for

MiB = 1024 * 1024


def overwrite(c, keys: list[bytes], value: bytes) -> None:
    c.send(b"".join(request(Opcode.SET_Q, key=k, extras=bytes(8), value=value, vbucket=c.vbucket_of(k))
                    for k in keys) + request(Opcode.NOOP, opaque=0xFFFF))
    while (reply := c.recv()).opaque != 0xFFFF:
        raise AssertionError(reply)


@pytest.fixture
def quick_checks(monkeypatch):
    monkeypatch.setattr(app, "FRAGMENTATION_CHECK_INTERVAL", 0.2)


def test_overwrites_are_compacted_once_history_passes_the_threshold(make_server, quick_checks):
    server = make_server(memory_quota=None)
    bucket = server.server.buckets["default"]
    keys = [b"hot%04d" % i for i in range(500)]
    measured = []
    with server.login() as c:
        for r in range(30):
            overwrite(c, keys, b"%04d" % r * 100)
            wait_for(lambda: server.call(lambda: bucket.engine.stats()["ep_queue_size"]) == 0, what="persisted")
            checks = bucket.fragmentation_checks
            wait_for(lambda checks=checks: bucket.fragmentation_checks > checks + 1, what="a check after the round")
            measured.append(server.call(bucket.engine.store.fragmentation))
        wait_for(lambda: int(c.stats().get("couch_docs_fragmentation", 100)) <= 30, what="a compacted store measured")
        stats = c.stats()
    assert int(stats["ep_compactions_for_fragmentation"]) == bucket.fragmentation_compactions >= 3
    # trimmed to a quarter of each vbucket's documents whenever it passed 30% of the rows (without
    # compaction: 29 x 500 by the last round)
    assert max(f.history for f in measured) <= 500 * 0.43 + 64
    # freed pages are reused: after the first rounds the file stops growing (10 more rounds, no more file)
    assert measured[-1].file_bytes <= max(f.file_bytes for f in measured[:20]) * 1.1


def test_without_a_threshold_history_keeps_growing(make_server, quick_checks):
    """The same storm with fragmentation checks off (the hourly compaction alone): what the bound above
    prevents."""
    server = make_server(memory_quota=None, fragmentation_threshold=None)
    engine = server.server.buckets["default"].engine
    keys = [b"hot%04d" % i for i in range(500)]
    with server.login() as c:
        for r in range(10):
            overwrite(c, keys, b"%04d" % r * 100)
            wait_for(lambda: server.call(lambda: engine.stats()["ep_queue_size"]) == 0, what="persisted")
    assert engine.store.fragmentation().history >= 500 * 9


def test_a_fragmentation_measure_waits_twenty_times_what_the_last_one_took(make_server, quick_checks, monkeypatch):
    """A measure counts every stored row, so it costs more as the bucket grows: the next one waits
    FRAGMENTATION_COST_PACE times the CPU the last one took (at 10M documents a measure every 10 s
    would have kept a thread busy). Here each measure "takes" 10 s of the measuring thread's clock,
    so after the first none is due again for 200 s while writes and checks go on."""
    clock = [1000.0]
    monkeypatch.setattr(background, "fragmentation_clock", lambda: clock[0])
    server = make_server(memory_quota=None)
    bucket = server.server.buckets["default"]
    measure = bucket.engine.store.fragmentation

    def slow_measure():
        clock[0] += 10.0
        return measure()

    monkeypatch.setattr(bucket.engine.store, "fragmentation", slow_measure)
    with server.login() as c:
        for r in range(6):
            overwrite(c, [b"k%03d" % i for i in range(50)], b"%04d" % r)
            flushed = bucket.engine.flusher.items_flushed
            wait_for(lambda flushed=flushed: bucket.engine.flusher.items_flushed > flushed
                     or server.call(lambda: bucket.engine.stats()["ep_queue_size"]) == 0, what="persisted")
            checks = bucket.fragmentation_checks
            wait_for(lambda checks=checks: bucket.fragmentation_checks > checks + 1, what="a check after the round")
        assert bucket.fragmentation_measures == 1
        assert bucket.fragmentation_due >= server.call(time.monotonic) + 150
        server.call(lambda: setattr(bucket, "fragmentation_due", 0.0))  # as if the 200 s had passed
        overwrite(c, [b"k%03d" % i for i in range(50)], b"last")
        wait_for(lambda: bucket.fragmentation_measures == 2, what="a measure once due")


def test_a_write_storm_against_stopped_persistence_meets_etmpfail_within_the_checkpoint_quota(make_server):
    """Everything the flusher has not written is in checkpoints: with persistence stopped, writes are
    refused once checkpoints fill their 30% of the quota, so at most that much is ever acknowledged
    and not yet on disk; once persistence runs again, writes go on."""
    server = make_server(memory_quota=16 * MiB)
    value = b"w" * 2000
    with server.login() as c:
        assert c.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
        statuses = []
        for i in range(20_000):
            status = c.set(b"storm%05d" % i, value).status
            statuses.append(status)
            if status == Status.ETMPFAIL:
                break
        assert statuses[-1] == Status.ETMPFAIL and b"checkpoint memory is full" in c.set(b"x", value).value
        stats = c.stats()
        backlog = int(stats["ep_queue_size"])
        assert backlog * (len(value) + 96) <= 16 * MiB * 0.3 + 4 * (len(value) + 200)
        # refused once over the quota: the last write accepted may take it over by itself
        assert int(stats["ep_checkpoint_memory"]) <= int(stats["ep_checkpoint_memory_quota"]) + len(value) + 200
        assert c.call(Opcode.START_PERSISTENCE).status == Status.SUCCESS
        wait_for(lambda: c.set(b"after", value).status == Status.SUCCESS, what="writes accepted again")
