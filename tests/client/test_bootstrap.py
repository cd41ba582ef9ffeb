"""Bootstrap against a real dcpflow server: SDK-style connection, metadata requests, TLS, and clear
errors for wrong passwords, unknown buckets, unreachable hosts and missing privileges."""

import shutil
import socket
import subprocess

import pytest

from dcpflow.client import (
    AuthenticationError,
    BucketError,
    ConnectError,
    ConnectionStringError,
    DcpClient,
    Offset,
)
from dcpflow.protocol.keys import vbucket_for_key

from .conftest import PASSWORD, USER, run, url, write


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connect_and_metadata(server, writer):
    docs = write(writer, 200)
    writer.delete(b"doc7")
    per_vb: dict[int, int] = {}
    for key in docs:
        vb = vbucket_for_key(key, 64)
        per_vb[vb] = per_vb.get(vb, 0) + 1
    per_vb[vbucket_for_key(b"doc7", 64)] += 1

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            assert c.num_vbuckets == 64 and c.bucket == "default" and c.bucket_uuid
            highs = await c.high_seqnos()
            assert highs == {vb: per_vb.get(vb, 0) for vb in range(64)}
            assert await c.high_seqnos([3, 1]) == {1: per_vb.get(1, 0), 3: per_vb.get(3, 0)}
            logs = await c.failover_logs([0, 5])
            assert set(logs) == {0, 5} and all(len(v) >= 1 and v[0][0] for v in logs.values())
            now = await c.offsets_now([0])
            assert now == {0: Offset.at(logs[0][0][0], highs[0])}
            with pytest.raises(ValueError, match="out of range"):
                await c.high_seqnos([64])
    run(go())


def test_first_seed_down_second_up(server):
    dead = free_port()
    spec = f"couchbase://127.0.0.1:{dead},127.0.0.1:{server.port}/default"

    async def go():
        async with await DcpClient.connect(spec, USER, PASSWORD) as c:
            return c.num_vbuckets
    assert run(go()) == 64


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(password="nope"), AuthenticationError, "authentication as 'Administrator' with SCRAM-SHA512 failed: wrong"),
    (dict(bucket="nosuch"), BucketError, "'nosuch'"),
    (dict(username="reader", password="readpw", bucket="other"), BucketError, "may not access bucket 'other'"),
    (dict(sasl_mech_force="PLAIN"), AuthenticationError, "PLAIN is offered only over TLS"),
    (dict(username=""), AuthenticationError, "username and password are required"),
])
def test_clear_errors(server, kwargs, error, words):
    args = dict(username=USER, password=PASSWORD)
    args.update(kwargs)

    async def go():
        await DcpClient.connect(url(server.port), **args)
    with pytest.raises(error) as e:
        run(go())
    assert words in str(e.value)


def test_unreachable_and_bad_strings():
    port = free_port()

    async def go(spec, **kw):
        await DcpClient.connect(spec, USER, PASSWORD, **kw)
    with pytest.raises(ConnectError, match=f"127.0.0.1:{port}: .*[Rr]efused"):
        run(go(url(port), connect_timeout=2))
    with pytest.raises(ConnectionStringError, match="no bucket"):
        run(go(f"couchbase://127.0.0.1:{port}"))
    with pytest.raises(ConnectionStringError, match="unknown option"):
        run(go(f"couchbase://127.0.0.1:{port}/default?bogus=1"))


def test_events_need_the_dcp_privilege(server, writer):
    write(writer, 5)

    async def go():
        async with await DcpClient.connect(url(server.port), "reader", "readpw") as c:
            assert sum((await c.high_seqnos()).values()) == 5  # metadata is allowed to a data reader
            async for _ in c.events(end="now"):
                pass
    with pytest.raises(BucketError, match="may not open a DCP stream"):
        run(go())


@pytest.fixture(scope="module")
def ca_and_cert(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path_factory.mktemp("tls")
    run_ = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run_("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
         "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    run_("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(d / "key.pem"),
         "-out", str(d / "csr.pem"))
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run_("openssl", "x509", "-req", "-in", str(d / "csr.pem"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
         "-CAcreateserial", "-days", "1", "-extfile", str(d / "ext.cnf"), "-out", str(d / "cert.pem"))
    run_("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=other",
         "-keyout", str(d / "other.key"), "-out", str(d / "other.pem"))
    return d


def test_tls_with_ca_file(make_server, ca_and_cert):
    d = ca_and_cert
    server = make_server(tls_cert=str(d / "cert.pem"), tls_key=str(d / "key.pem"), tls_port=0)
    tls_port = server.server.tls_port
    with server.login() as w:
        write(w, 20)

    async def read(spec, **kw):
        async with await DcpClient.connect(spec, USER, PASSWORD, **kw) as c:
            n = 0
            async for ev in c.events(end="now"):
                n += ev.event == "mutation"
            return n
    assert run(read(f"couchbases://127.0.0.1:{tls_port}/default?ca_file={d / 'ca.pem'}")) == 20
    assert run(read(f"couchbases://127.0.0.1:{tls_port}/default?tls_verify=none")) == 20
    with pytest.raises(ConnectError, match="not trusted.*ca_file"):
        run(read(f"couchbases://127.0.0.1:{tls_port}/default?ca_file={d / 'other.pem'}"))
    with pytest.raises(ConnectError, match="cannot load CA file"):
        run(read(f"couchbases://127.0.0.1:{tls_port}/default?ca_file={d / 'missing.pem'}"))
    # Inside TLS the server offers PLAIN, as Couchbase Server does.
    assert run(read(f"couchbases://127.0.0.1:{tls_port}/default?tls_verify=none&sasl_mech_force=PLAIN")) == 20
