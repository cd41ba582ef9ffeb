"""Snappy (HELLO Snappy, datatype 0x02): compressed values are accepted from clients that
negotiated it, on every write that carries a value, and stored and served inflated; invalid
Snappy is EINVAL, a block declaring more than the document limit E2BIG. The official SDK, which
negotiates Snappy and compresses large values, round-trips them."""

import json

from dcpflow.protocol import snappy
from dcpflow.protocol import subdoc as sd
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.meta import SetWithMeta
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import RawClient

WITH_SNAPPY = (Feature.XERROR, Feature.JSON, Feature.SNAPPY, Feature.XATTR)
DOC = json.dumps({"text": "compress me " * 50}).encode()


def test_compressed_values_are_stored_and_served_inflated(server):
    with server.client() as c:
        c.login(features=WITH_SNAPPY)
        assert c.set(b"z", snappy.compress(DOC), datatype=0x03).status == Status.SUCCESS
        got = c.get(b"z")
        assert got.value == DOC and got.datatype == 0x01
        got = c.call(Opcode.SUBDOC_GET, key=b"z", extras=b"\x00\x04\x00", value=b"text", vbucket=c.vbucket_of(b"z"))
        assert json.loads(got.value) == "compress me " * 50
        append = c.call(Opcode.APPEND, key=b"z", value=snappy.compress(b"  "), datatype=0x02,
                        vbucket=c.vbucket_of(b"z"))
        assert append.status == Status.SUCCESS and c.get(b"z").value == DOC + b"  "
        meta = SetWithMeta(b"wm", snappy.compress(DOC), flags=0, expiration=0, rev_seqno=3, meta_cas=1 << 40,
                           datatype=0x03, vbucket=c.vbucket_of(b"wm"), opaque=7)
        c.send(meta.encode())
        assert c.recv().status == Status.SUCCESS
        assert c.get(b"wm").value == DOC
        assert c.set(b"bad", b"\x10not snappy at all", datatype=0x02).status == Status.EINVAL
        bomb = b"\xff\xff\xff\x7f" + b"\x00" * 8
        assert c.set(b"bomb", bomb, datatype=0x02).status == Status.E2BIG
        assert c.get(b"bad").status == Status.KEY_ENOENT and c.get(b"bomb").status == Status.KEY_ENOENT
    with server.client() as plain:
        plain.login()
        assert plain.set(b"z2", snappy.compress(DOC), datatype=0x02).status == Status.EINVAL  # not negotiated
        assert plain.get(b"z").value == DOC + b"  "


def test_subdoc_requests_are_raw(server):
    with server.client() as c:
        c.login(features=WITH_SNAPPY)
        c.set(b"r", b"{}", datatype=1)
        spec = sd.SubdocSpec(Opcode.SUBDOC_DICT_UPSERT, b"a", b"1").encode(True)
        reply = c.call(Opcode.SUBDOC_MULTI_MUTATION, key=b"r", value=snappy.compress(spec), datatype=0x02,
                       vbucket=c.vbucket_of(b"r"))
        assert reply.status == Status.EINVAL  # kv_engine's validator takes raw sub-document requests only


def test_the_sdk_round_trips_compressible_documents(server):
    from .test_sdk import connect
    cluster = connect(server.port)
    try:
        col = cluster.bucket("default").default_collection()
        big = {"rows": [{"name": "row", "n": i} for i in range(500)]}
        col.upsert("sdk-snappy", big)
        assert col.get("sdk-snappy").content_as[dict] == big
    finally:
        cluster.close()
    with RawClient(server.port) as c:
        c.login()
        got = c.get(b"sdk-snappy")
        assert got.datatype == 0x01 and json.loads(got.value) == big


def test_dcp_force_value_compression(server):
    """control.md: with HELLO Snappy a consumer may ask for compressed values; every mutation then
    carries the Snappy bit (memory and backfill alike) and inflates to the stored document."""
    from dcpflow.protocol import dcp as dcpproto
    with server.client() as c:
        c.login(features=WITH_SNAPPY)
        vb = c.vbucket_of(b"dz")
        c.set(b"dz", DOC, datatype=1)
    for features, status in (((Feature.XERROR, Feature.JSON), Status.EINVAL), (WITH_SNAPPY, Status.SUCCESS)):
        with server.client() as d:
            d.login(features=features)
            d.send(dcpproto.DcpOpen(b"snappy-test", dcpproto.OpenFlag.PRODUCER, opaque=1).encode())
            assert d.recv().status == Status.SUCCESS
            d.send(dcpproto.DcpControl(b"force_value_compression", b"true", opaque=2).encode())
            assert d.recv().status == status
            if status != Status.SUCCESS:
                continue
            d.send(dcpproto.DcpStreamRequest(vb, 0, opaque=3).encode())
            while True:
                frame = d.recv()
                if frame.opcode == Opcode.DCP_MUTATION and frame.key == b"dz":
                    break
            assert frame.datatype == 0x03 and snappy.decompress(frame.value) == DOC
