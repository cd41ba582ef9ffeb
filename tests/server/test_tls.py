"""TLS on a second port (kvSSL): the same protocol inside TLS, advertised in the cluster map."""

import json
import shutil
import ssl
import subprocess
from datetime import timedelta

import pytest

from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import RawClient

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")], check=True, capture_output=True)
    return str(d / "cert.pem"), str(d / "key.pem")


def test_tls_port_serves_the_same_protocol(make_server, cert):
    server = make_server(tls_cert=cert[0], tls_key=cert[1], tls_port=0)
    assert server.server.tls_port not in (None, server.port)
    with RawClient(server.server.tls_port, tls=True) as c:
        c.num_vbuckets = 64
        c.login()
        assert isinstance(c.sock, ssl.SSLSocket)
        assert c.call(Opcode.SASL_LIST_MECHS).value.split()[-1] == b"PLAIN"  # inside TLS, PLAIN is offered
        assert c.set(b"secret", b"v").status == Status.SUCCESS
        config = json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)
        assert config["nodesExt"][0]["services"] == {"kv": server.port, "mgmt": server.server.mgmt.port,
                                                     "kvSSL": server.server.tls_port,
                                                     "mgmtSSL": server.server.mgmt.tls_port}
    with RawClient(server.server.tls_port, tls=True) as c:
        assert c.auth_plain("Administrator", "password").status == Status.SUCCESS
        assert c.select("default").status == Status.SUCCESS
    with server.login() as plain:
        assert plain.get(b"secret").value == b"v"
    with RawClient(server.server.tls_port) as c:  # plain bytes on the TLS port: the handshake fails
        c.send(b"\x80" + bytes(23))
        assert c.is_closed()


def test_sdk_over_tls(spawn_server, tmp_path, cert):
    from .test_sdk import connect
    proc = spawn_server("--data-dir", str(tmp_path), "--vbuckets", "64", "--tls-cert", cert[0], "--tls-key", cert[1],
                        "--tls-port", "0")
    tls_port = int(proc.ready_line.split("tls_port=")[1].split()[0])
    cluster = connect(tls_port, "?ssl=no_verify", scheme="couchbases")
    try:
        coll = cluster.bucket("default").default_collection()
        coll.upsert("over-tls", {"ok": True}, timeout=timedelta(seconds=30))
        assert coll.get("over-tls").content_as[dict] == {"ok": True}
    finally:
        cluster.close()
