"""The checkpoint rules of dcpflow.replication.xdcr.checkpoints, without servers."""

import json

import pytest

from dcpflow.client.offsets import Offset
from dcpflow.replication.xdcr.checkpoints import (
    BEGINNING,
    KEEP,
    CheckpointError,
    CheckpointStore,
    Generation,
    Generations,
    target_survives,
)

# newest first: the branch 0xC began at seqno 50, 0xB at 20, 0xA at 0
LOG = [(0xC, 50), (0xB, 20), (0xA, 0)]


@pytest.mark.parametrize(("position", "survives"), [
    ((0xC, 10_000), True),  # the current branch keeps everything
    ((0xB, 50), True), ((0xB, 51), False),  # 0xB ended where 0xC began
    ((0xA, 20), True), ((0xA, 21), False),
    ((0xD, 1), False),  # a branch the target does not know: dropped by a failover
])
def test_target_survives_follows_the_failover_log(position, survives):
    assert target_survives(position, LOG) is survives


def test_the_newest_generation_still_whole_on_the_target_is_chosen():
    old = Generation({0: Offset.at(1, 10)}, {0: (0xB, 40)})
    mid = Generation({0: Offset.at(1, 20)}, {0: (0xB, 60)})  # the target lost 51..60
    new = Generation({0: Offset.at(1, 30)}, {0: (0xC, 70)})  # and its branch came after
    gens = Generations({}, [new, mid, old])
    assert gens.safe_for({0: [(0xD, 50), (0xB, 20)]}) is old  # 0xC is unknown now, 0xB ended at 50
    assert gens.safe_for({0: LOG}) is new
    assert gens.safe_for({0: [(0xE, 0)]}) is BEGINNING
    gens.forget(old, [0], [0])  # vbucket 0 goes back to `old`: the newer ones say what it says of it
    assert [(g.source, g.target) for g in gens.items] == [(old.source, old.target)] * 3
    gens.forget(BEGINNING, [0], [0])
    assert [(g.source, g.target) for g in gens.items] == [({}, {})] * 3


def test_store_round_trip_keeps_the_last_generations_and_refuses_another_replication(tmp_path):
    store = CheckpointStore(tmp_path / "s")
    ident = {"source_bucket": "a", "source_uuid": "u1", "target_bucket": "b", "target_uuid": "u2"}
    gens = store.load(ident)
    assert gens.newest is BEGINNING
    for i in range(KEEP + 3):
        gens.add(Generation({vb: Offset(7, i, max(0, i - 1), i + 5) for vb in range(3)}, {1: (9, i)}))
        store.save(gens)
    back = store.load(ident)
    assert len(back.items) == KEEP and back.newest == gens.newest
    assert back.newest.source[2] == Offset(7, KEEP + 2, KEEP + 1, KEEP + 7)
    with pytest.raises(CheckpointError, match="target_uuid is 'u2', this one's is 'other'"):
        store.load({**ident, "target_uuid": "other"})
    (tmp_path / "s" / "checkpoints.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="is not JSON"):
        store.load(ident)
    (tmp_path / "s" / "checkpoints.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(CheckpointError, match="format 99"):
        store.load(ident)


def test_cli_refuses_a_bad_key_filter_before_connecting(tmp_path, capsys):
    from dcpflow.cli import main
    rc = main(["xdcr", "couchbase://127.0.0.1:1/a", "couchbase://127.0.0.1:1/b", "--state-dir", str(tmp_path),
               "--filter-key", "("])
    assert rc == 2 and "is not a regular expression" in capsys.readouterr().err


def test_broken_mappings_round_trip_and_a_malformed_list_is_refused(tmp_path):
    """A generation keeps the collections still to be backfilled; a file written before they
    existed reads as none."""
    store = CheckpointStore(tmp_path / "s")
    gens = store.load({})
    gens.add(Generation({0: Offset.at(1, 5)}, {}))
    gens.add(Generation({0: Offset.at(1, 9)}, {}, (("app", "late"), ("shop", "orders"))))
    store.save(gens)
    back = store.load({})
    assert back.newest.broken == (("app", "late"), ("shop", "orders")) and back.items[1].broken == ()
    doc = json.loads((tmp_path / "s" / "checkpoints.json").read_text())
    assert "broken" not in doc["generations"][1]
    doc["generations"][0]["broken"] = [["app"]]
    (tmp_path / "s" / "checkpoints.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="broken is not a list of"):
        store.load({})


def test_a_rewind_of_some_vbuckets_keeps_what_the_checkpoints_say_of_the_others(tmp_path):
    """A target restarted without persisting anything comes back on new branches whose failover
    logs still hold the old branch up to seqno 0. The first reply from it names one vbucket (0);
    the rewind of that one must not make the checkpoints forget that vbucket 1 held our writes up
    to seqno 5 on the old branch, or the next full check finds vbucket 1 whole (its record would
    be the first checkpoint's, seqno 0) and its lost writes are never sent again (the bidirectional
    kill -9 test's tombstone on A and nothing on B, under load, where the first news of the
    restart came in a write reply rather than at a checkpoint)."""
    from types import SimpleNamespace

    from dcpflow.replication.xdcr.replicator import XdcrReplicator

    old, new = 0xB, 0xC
    rep = XdcrReplicator("couchbase://127.0.0.1:1/a", "couchbase://127.0.0.1:2/b", username="u", password="p",
                         state_dir=tmp_path)
    rep.source = SimpleNamespace(num_vbuckets=2)
    rep.target = SimpleNamespace(client=SimpleNamespace(num_vbuckets=2))
    first = Generation({0: Offset.at(7, 0), 1: Offset.at(7, 0)}, {0: (old, 0), 1: (old, 0)})
    later = Generation({0: Offset.at(7, 10), 1: Offset.at(7, 10)}, {0: (old, 5), 1: (old, 5)})
    rep._generations = Generations({}, [later, first])
    rep.positions = {0: Offset.at(7, 12), 1: Offset.at(7, 12)}
    restarted = {0: [(new, 0), (old, 0)], 1: [(new, 0), (old, 0)]}

    async def check(vbuckets):
        return await rep._lost_target_vbuckets(vbuckets, {vb: restarted[vb] for vb in vbuckets})

    import asyncio
    lost = asyncio.run(check([0]))  # the write reply's vbucket
    assert set(lost) == {0}
    rep._rewind(lost)
    assert rep.positions[0].seqno == 0 and rep.positions[1].seqno == 12
    lost = asyncio.run(check([0, 1]))  # the next checkpoint looks at every vbucket
    assert set(lost) == {1}, "vbucket 1's writes 1..5 on the old branch were lost and must be sent again"
    rep._rewind(lost)
    assert rep.positions == {0: Offset.at(7, 0), 1: Offset.at(7, 0)}
    assert rep._generations.newest.target == {0: (old, 0), 1: (old, 0)}
