"""Options of the `dcp` source: parsed once, and every mistake named with what to do (no Spark)."""

import pytest

from dcpflow.client import Offset
from dcpflow.spark.offsets import OffsetSpec
from dcpflow.spark.options import DcpOptionError, parse_options, parse_size, parse_vbuckets

BASE = {"connection": "couchbase://127.0.0.1:11999/default", "username": "u", "password": "p"}


def opts(**extra):
    return parse_options({**BASE, **extra})


def test_defaults_and_case_insensitive_names():
    o = parse_options({"CONNECTION": "couchbase://h:1/b", "UserName": "u", "password": "p",
                       "MAXSEQNOSPERTRIGGER": "1_000", "valueformat": "JSON"})
    assert o.bucket == "b" and o.connection_string == "couchbase://h:1/b"
    assert o.max_seqnos_per_trigger == 1000 and o.value_format == "json" and o.value_schema is None
    d = opts()
    assert (d.starting_offsets, d.ending_offsets, d.vbuckets, d.rollback) == ("earliest", None, None, "reread")
    assert opts(endingOffsets="latest").ending_offsets == "latest"  # given: a stream refuses it
    assert d.key_format == "string" and d.value_format == "binary" and d.partitions >= 1


def test_bucket_option_and_url_must_agree():
    assert parse_options({**BASE, "connection": "couchbase://h:1", "bucket": "travel"}).bucket == "travel"
    assert parse_options({**BASE, "connection": "couchbase://h:1"}).bucket == "default"
    with pytest.raises(DcpOptionError, match="give the bucket once"):
        opts(bucket="other")


@pytest.mark.parametrize(("extra", "message"), [
    ({"maxSeqnoPerTrigger": "5"}, "Did you mean 'maxSeqnosPerTrigger'"),
    ({"connection": "http://h:1/b"}, "option 'connection'.*scheme"),
    ({"connection": ""}, "'connection' is required"),
    ({"connection": "couchbase://h:99999/b"}, "option 'connection'.*port"),
    ({"vbuckets": "3-1"}, "runs backwards"),
    ({"vbuckets": "a"}, "not a vbucket id"),
    ({"vbuckets": ","}, "names no vbucket"),
    ({"startingOffsets": "{bad"}, "startingOffsets.*JSON"),
    ({"startingOffsets": '{"0": {"seqno": 1}}'}, "missing 'vbuuid'"),
    ({"startingOffsets": '{"0": {"vbuuid": 1, "seqno": 5, "snapshot_start": 6}}'}, "snapshot_start <= seqno"),
    ({"startingOffsets": '{"x": "earliest"}'}, "not a number"),
    ({"startingOffsets": '{"0": {"vbuuid": -1, "seqno": 5}}'}, "unsigned 64-bit"),
    ({"maxSeqnosPerTrigger": "0"}, "at least 1"),
    ({"maxSeqnosPerTrigger": "many"}, "whole number"),
    ({"maxBytesPerTrigger": "lots"}, "size like"),
    ({"partitions": "-2"}, "at least 1"),
    ({"valueFormat": "xml"}, "binary, string, json"),
    ({"valueSchema": "a INT"}, "only applies with valueFormat=json"),
    ({"rollback": "ignore"}, "reread, fail"),
    ({"timeout": "0"}, "positive"),
])
def test_bad_options_name_the_option(extra, message):
    with pytest.raises(DcpOptionError, match=message):
        opts(**extra)


def test_credentials_required():
    with pytest.raises(DcpOptionError, match="'password' is required"):
        parse_options({"connection": "couchbase://h/b", "username": "u"})


def test_offsets_json_forms():
    o = opts(startingOffsets='{"batch": 3, "vbuckets": {"0": {"vbuuid": 9, "seqno": 4}, "1": "latest"}}')
    assert o.starting_offsets == OffsetSpec({0: Offset(9, 4, 4, 4), 1: "latest"}, 3)
    o = opts(endingOffsets='{"2": [9, 4, 3, 6]}')
    assert o.ending_offsets.vbuckets == {2: Offset(9, 4, 3, 6)}
    o = opts(startingOffsets='{"batch": 1, "vbuckets": {"0": [9, 4], "5": [9, 7, 6, 8]}, "origin": {}}')
    assert o.starting_offsets == OffsetSpec({0: Offset(9, 4, 4, 4), 5: Offset(9, 7, 6, 8)}, 1)


def test_sizes_and_vbucket_lists():
    assert parse_size("64m") == 64 << 20 and parse_size("1g") == 1 << 30 and parse_size("512MiB") == 512 << 20
    assert parse_size("100") == 100
    assert opts(maxBytesPerTrigger="2k").max_bytes_per_trigger == 2048
    assert parse_vbuckets("5, 0-2,2") == (0, 1, 2, 5)
    assert opts(vbuckets="all").vbuckets is None
