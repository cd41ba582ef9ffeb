"""PreserveTtl (request frame 5, HELLO PreserveTtl) on every mutation that takes it in kv_engine's
opcode table: SET, REPLACE, INCREMENT/DECREMENT, APPEND/PREPEND and the sub-document mutations
keep the document's expiry; without the frame SET, REPLACE and sub-document mutations set the
expiry the request carries (none: no expiry), while counters and APPEND/PREPEND always keep it."""

import struct

import pytest

from dcpflow.protocol import subdoc as sd
from dcpflow.protocol.frame import RequestFrameId, encode_frame_info
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.meta import GetMetaResponse
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

KEEP = encode_frame_info(RequestFrameId.PRESERVE_TTL)


def expiry_of(c, key: bytes) -> int:
    return GetMetaResponse.from_frame(c.call(Opcode.GET_META, key=key, vbucket=c.vbucket_of(key))).expiry


def counter(c, key, framing):
    return c.call(Opcode.INCREMENT, key=key, extras=struct.pack(">QQI", 1, 0, 0), vbucket=c.vbucket_of(key),
                  framing=framing)


def append(c, key, framing):
    return c.call(Opcode.APPEND, key=key, value=b"x", vbucket=c.vbucket_of(key), framing=framing)


def replace(c, key, framing):
    return c.set(key, b"9", opcode=Opcode.REPLACE, framing=framing)


def subdoc_counter(c, key, framing):
    return c.call(Opcode.SUBDOC_MULTI_MUTATION, key=key, vbucket=c.vbucket_of(key), framing=framing,
                  value=sd.SubdocSpec(Opcode.SUBDOC_COUNTER, b"n", b"1").encode(True))


@pytest.mark.parametrize("mutation, keeps_without_frame", [
    (replace, False), (counter, True), (append, True), (subdoc_counter, False)])
def test_mutations_that_take_preserve_ttl(server, mutation, keeps_without_frame):
    with server.client() as c:
        c.login(features=(Feature.XERROR, Feature.ALT_REQUEST_SUPPORT, Feature.PRESERVE_TTL, Feature.JSON))
        value = b"1" if mutation in (counter, append) else b'{"n": 1}'
        c.set(b"p", value, expiry=3600)
        before = expiry_of(c, b"p")
        assert before
        assert mutation(c, b"p", KEEP).status == Status.SUCCESS
        assert expiry_of(c, b"p") == before
        assert mutation(c, b"p", b"").status == Status.SUCCESS
        assert (expiry_of(c, b"p") == before) == keeps_without_frame
