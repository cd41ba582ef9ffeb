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
    gens.drop_newer_than(old)
    assert gens.items == [old]
    gens.drop_newer_than(BEGINNING)
    assert gens.items == []


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
