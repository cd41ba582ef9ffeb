"""`dcpflow demo` (the README's first command) end to end, and the CLI's clear errors."""

import re
import sys
from collections import Counter

import pyarrow.dataset as pads
import pytest

from dcpflow.cli import main
from tests.processes import run_group

from .test_pipeline_runs import quick_jvm


def test_demo_end_to_end_with_the_spark_native_state(tmp_path):
    # Small, so it fits the test budget; the state kept by Spark-native compaction (the delta
    # writer is exercised by test_source.py). Exit status 0 means state == server, key by key.
    proc = run_group([sys.executable, "-m", "dcpflow.cli", "demo", "--docs", "3000", "--rounds", "2",
                      "--vbuckets", "16", "--state-format", "snapshot", "--dir", str(tmp_path / "demo")],
                     capture_output=True, text=True, timeout=300, env=quick_jvm())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "OK: state table == server contents" in out
    assert "documents loaded      3,000 into scope shop" in out and "live batch" in out and "expiration" in out
    assert (tmp_path / "demo" / "lake" / "state" / "current").is_symlink()
    # The collections, made through the SDK's collection manager with their settings.
    assert ("created scope shop through the SDK's collection manager: users, products, orders (history), "
            "sessions (maxTTL 3600s)") in out
    # Every collection verified key by key; the per-collection keys add up to the keys verified.
    per = {m["name"]: (int(m["keys"].replace(",", "")), m["verdict"]) for m in re.finditer(
        r"^    shop\.(?P<name>\w+) +(?P<keys>[\d,]+) keys: .*?gone, (?P<verdict>[^;]+);", out, re.M)}
    assert set(per) == {"users", "products", "orders", "sessions"}, out[-3000:]
    assert all(verdict == "state == server" for _, verdict in per.values()), out[-3000:]
    total = int(re.search(r"verified +([\d,]+) keys", out).group(1).replace(",", ""))
    assert sum(n for n, _ in per.values()) == total == 3030  # 3,000 loaded + 2 rounds of 15 sessions
    # orders keeps every version: as many in the change log as written, more than its keys.
    history = re.search(r"history \(orders\) +every version: ([\d,]+) in the change log = ([\d,]+) written, "
                        r"of ([\d,]+) keys", out)
    versions, written, keys = (int(g.replace(",", "")) for g in history.groups())
    assert versions == written > keys == per["orders"][0]
    assert re.search(r"de-duplicated \(users\) [\d,]+ in the change log of [\d,]+ written "
                     r"\(at most \d+ of one key in a micro-batch, 1 in a DCP snapshot\)", out), out[-3000:]
    # The lake itself, read without Spark: the state keyed by (scope, collection, key); the change
    # log with every version of the orders written in bursts, and users never two of a key in one
    # DCP snapshot (de-duplicated).
    lake = tmp_path / "demo" / "lake"
    state = pads.dataset(sorted((lake / "state" / "current").resolve().glob("*.parquet"))).to_table()
    assert set(zip(state.column("scope").to_pylist(), state.column("collection").to_pylist(), strict=True)) == {
        ("shop", name) for name in ("users", "products", "orders", "sessions")}
    changes = pads.dataset(lake / "changelog", format="parquet").to_table(
        columns=["collection", "key", "_change_type", "_commit_version", "vbucket", "snapshot_start"])
    upserts = Counter()
    for row in changes.to_pylist():
        if row["_change_type"] == "upsert":
            upserts[(row["collection"], row["_commit_version"], row["vbucket"], row["snapshot_start"], row["key"])] += 1
    per_order = Counter()
    for (collection, *_, key), n in upserts.items():
        if collection == "orders":
            per_order[key] += n
    assert max(per_order.values()) >= 4  # loaded, then a burst of three versions in a row
    assert sum(per_order.values()) == versions and len(per_order) == keys
    assert max(n for k, n in upserts.items() if k[0] == "users") == 1
    # queries stopped between batches: no Java thread died (Spark's StackOverflowError on an interrupted batch)
    assert "Exception in thread" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-3000:]


def test_the_demo_fails_on_a_missing_version_or_a_duplicate_in_a_snapshot():
    from dcpflow.spark.demo import version_mismatches

    good = {"orders": {"upserts": 7, "written": 7, "per_snapshot": 3},  # history: several per snapshot
            "users": {"upserts": 4, "written": 6, "per_snapshot": 1}}  # de-duplicated: fewer than written
    assert version_mismatches(good) == []
    lost = {**good, "orders": {"upserts": 6, "written": 7, "per_snapshot": 3}}
    assert version_mismatches(lost) == [("shop.orders change log", "7 versions written", "6 versions")]
    dup = {**good, "users": {"upserts": 6, "written": 6, "per_snapshot": 2}}
    assert [m[0] for m in version_mismatches(dup)] == ["shop.users change log"]
    assert version_mismatches({**good, "orders": {"upserts": 8, "written": 7, "per_snapshot": 1}})  # too many


def test_pipeline_rejects_bad_options_before_starting_spark(capsys):
    assert main(["pipeline", "--connection", "couchbase://127.0.0.1:1/default", "--lake", "/nonexistent",
                 "--option", "maxSeqnoPerTrigger=5"]) == 2
    assert "Did you mean 'maxSeqnosPerTrigger'" in capsys.readouterr().err
    assert main(["pipeline", "--connection", "http://x", "--lake", "/nonexistent"]) == 2
    assert "option 'connection'" in capsys.readouterr().err
    assert main(["pipeline", "--connection", "couchbase://h/b", "--lake", "/x", "--option", "novalue"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
    assert main(["demo", "--docs", "0"]) == 2


def test_pipeline_collection_flags_become_source_options(capsys):
    assert main(["pipeline", "--connection", "couchbase://h/b", "--lake", "/x", "--collection", "a.b.c"]) == 2
    assert "option 'collections'" in capsys.readouterr().err
    assert main(["pipeline", "--connection", "couchbase://h/b", "--lake", "/x", "--scope", "shop",
                 "--collection", "other.c"]) == 2
    assert "not in scope 'shop'" in capsys.readouterr().err


def test_collection_options_parse():
    from dcpflow.spark.options import DcpOptionError, parse_options

    base = {"connection": "couchbase://h/b", "username": "u", "password": "p"}
    opts = parse_options({**base, "scope": "shop", "collections": "orders, users", "history": "TRUE"})
    assert opts.filters == {"scope": "shop", "collections": ["orders", "users"], "history": True,
                            "sync_writes": False}
    assert parse_options(base).filters == {"scope": None, "collections": None, "history": False,
                                          "sync_writes": False}
    with pytest.raises(DcpOptionError, match="history"):
        parse_options({**base, "history": "yes"})
