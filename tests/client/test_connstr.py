"""Connection strings: the SDK syntax, defaults, and a clear error for every way to get it wrong."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpflow.client import ConnectionStringError, parse_connection_string


def test_defaults_and_hosts():
    spec = parse_connection_string("couchbase://db1,db2:12000,[::1]:11300/travel-sample?buffer_size=1024")
    assert spec.hosts == (("db1", 11210), ("db2", 12000), ("::1", 11300))
    assert spec.bucket == "travel-sample" and not spec.tls and spec.options == {"buffer_size": 1024}
    tls = parse_connection_string("couchbases://h/b?ca_file=/x/ca.pem&tls_verify=none")
    assert tls.hosts == (("h", 11207),) and tls.tls and tls.options == {"ca_file": "/x/ca.pem", "tls_verify": "none"}
    assert parse_connection_string("couchbase://h").bucket is None
    assert parse_connection_string("COUCHBASE://h/").bucket is None
    assert parse_connection_string("couchbases://h/b?certpath=/ca").options == {"ca_file": "/ca"}  # SDK alias
    assert parse_connection_string("couchbase://h/b?sasl_mech_force=plain").options == {"sasl_mech_force": "PLAIN"}
    assert parse_connection_string("couchbase://h/my%20bucket").bucket == "my bucket"


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("localhost:11210", "no scheme"),
    ("http://h/b", "scheme 'http' is not supported"),
    ("couchbase://h:abc/b", "port 'abc'"),
    ("couchbase://h:0/b", "between 1 and 65535"),
    ("couchbase://h:70000/b", "between 1 and 65535"),
    ("couchbase://h:/b", "port ''"),
    ("couchbase://h,,g/b", "empty host"),
    ("couchbase://::1/b", "put it in brackets"),
    ("couchbase://[::1/b", "closing ']'"),
    ("couchbase://user:pw@h/b", "credentials"),
    ("couchbase://h/a/b", "contains '/'"),
    ("couchbase://h/b?nosuch=1", "unknown option 'nosuch'"),
    ("couchbase://h/b?buffer_size=-1", "between 0 and"),
    ("couchbase://h/b?buffer_size=big", "not a whole number"),
    ("couchbase://h/b?noop_interval=0.01", "must be >= 0.1"),
    ("couchbase://h/b?tls_verify=maybe", "one of peer, none"),
    ("couchbase://h/b?sasl_mech_force=MD5", "one of SCRAM-SHA512"),
    ("couchbase://h/b?ca_file=/ca.pem", "couchbases://"),
    ("couchbase://h/b?buffer_size=", "has no value"),
])
def test_errors_say_what_is_wrong(text, words):
    with pytest.raises(ConnectionStringError) as e:
        parse_connection_string(text)
    assert words in str(e.value)


_host = st.from_regex(r"[a-z][a-z0-9\-]{0,10}(\.[a-z][a-z0-9]{0,5}){0,2}", fullmatch=True)


@given(hosts=st.lists(st.tuples(_host, st.one_of(st.none(), st.integers(1, 65535))), min_size=1, max_size=4),
       bucket=st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_.%\-]{1,20}", fullmatch=True).filter(
           lambda b: "%" not in b)),
       tls=st.booleans())
def test_round_trip(hosts, bucket, tls):
    text = ("couchbases://" if tls else "couchbase://") + ",".join(
        h if p is None else f"{h}:{p}" for h, p in hosts) + (f"/{bucket}" if bucket else "")
    spec = parse_connection_string(text)
    default = 11207 if tls else 11210
    assert spec.hosts == tuple((h, default if p is None else p) for h, p in hosts)
    assert spec.bucket == bucket and spec.tls == tls
    again = parse_connection_string(str(spec))
    assert (again.hosts, again.bucket, again.tls) == (spec.hosts, spec.bucket, spec.tls)
