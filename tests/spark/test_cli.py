"""`dcpflow demo` (the README's first command) end to end, and the CLI's clear errors."""

import subprocess
import sys

import pytest

from dcpflow.cli import main


def test_demo_end_to_end_with_the_spark_native_state(tmp_path):
    # Small, so it fits the test budget; the state kept by Spark-native compaction (the delta
    # writer is exercised by test_source.py). Exit status 0 means state == server, key by key.
    proc = subprocess.run([sys.executable, "-m", "dcpflow.cli", "demo", "--docs", "3000", "--rounds", "2",
                           "--vbuckets", "16", "--state-format", "snapshot", "--dir", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "OK: state table == server contents" in out
    assert "documents loaded      3,000" in out and "live batch" in out and "expiration" in out
    assert (tmp_path / "demo" / "lake" / "state" / "current").is_symlink()
    # queries stopped between batches: no Java thread died (Spark's StackOverflowError on an interrupted batch)
    assert "Exception in thread" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-3000:]


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
    assert opts.filters == {"scope": "shop", "collections": ["orders", "users"], "history": True}
    assert parse_options(base).filters == {"scope": None, "collections": None, "history": False}
    with pytest.raises(DcpOptionError, match="history"):
        parse_options({**base, "history": "yes"})
