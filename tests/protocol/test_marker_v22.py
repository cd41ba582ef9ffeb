"""Snapshot marker V2.2 (snapshot-marker.md): both value layouts clients meet are accepted - the
52-byte one with the high prepared seqno (what this producer sends, for Disk snapshots once
`max_marker_version=2.2`) and the 44-byte one that ends with the purge seqno - by the typed decoder,
the rules, the fast field reader and the flow-control charge. Both pinned byte for byte."""

import struct

import pytest

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import DcpSnapshotMarker, MarkerVersion, charged_size, decode_dcp, marker_fields
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import FrameDecoder

HEAD = bytes.fromhex("80560000" "01000003" "00000035" "deadbeef" "0000000000000000")  # vb 3, body 53
FIELDS = bytes.fromhex("0000000000000001" "0000000000000008" "00000002" "0000000000000008"
                       "0000000000000007" "0000000000000005")  # start 1, end 8, Disk, MVS 8, HCS 7, purge 5
LONG = HEAD + b"\x02" + FIELDS + bytes.fromhex("0000000000000006")  # + HPS 6: 52-byte value
SHORT = HEAD[:8] + b"\x00\x00\x00\x2d" + HEAD[12:] + b"\x02" + FIELDS  # body 45: 44-byte value


def frame_of(data: bytes):
    d = FrameDecoder()
    d.feed(data)
    return d.next_frame()


@pytest.mark.parametrize("data, hps", [(LONG, 6), (SHORT, None)], ids=["52-byte", "44-byte"])
def test_both_v22_layouts_decode_and_encode_back_to_the_same_bytes(data, hps):
    msg = DcpSnapshotMarker.from_frame(frame_of(data))
    assert msg == DcpSnapshotMarker(3, 1, 8, 0x02, MarkerVersion.V2_2, 8, 7, 5, hps, 0xDEADBEEF)
    assert msg.encode() == data
    assert decode_dcp(frame_of(data)) == msg
    assert marker_fields(data, 0) == (1, 8, 5)
    assert charged_size(msg) == len(data)


def test_the_producer_sends_the_52_byte_layout():
    sent = DcpSnapshotMarker(3, 1, 8, 0x02, MarkerVersion.V2_2, 8, 7, 5, 6, 0xDEADBEEF).encode()
    assert sent == LONG and len(sent) - 24 - 1 == dcp.MARKER_V2_VALUE_BYTES[MarkerVersion.V2_2] == 52
    assert dcp.MARKER_V22_SHORT == 44


@pytest.mark.parametrize("size", [36, 43, 45, 51, 53, 60])
def test_other_v22_value_sizes_are_refused(size):
    value = (FIELDS + bytes(16))[:size]
    data = HEAD[:8] + struct.pack(">I", 1 + size) + HEAD[12:] + b"\x02" + value
    with pytest.raises(ProtocolError, match=r"must be 52 bytes \(or 44, without the high prepared seqno\)"):
        DcpSnapshotMarker.from_frame(frame_of(data))
    assert marker_fields(data, 0) is None
