"""`dcpflow inspect`: the real console script on the reference examples (corrected: decodes with no
problem; upstream: reports the erratum), plus input tolerance and exit codes."""

import json
import subprocess
import sys

import pytest
from hypothesis import given

from dcpflow.inspect import inspect_bytes, parse_hex
from dcpflow.protocol import dcp
from dcpflow.protocol.status import Status
from tests.protocol.reference_frames import EXAMPLES, FAILOVER_LOG_AS_PRINTED, UPSTREAM_EXAMPLES
from tests.protocol.test_fuzz import FUZZ, near_valid_frames


def run_inspect(text: str, *args: str) -> tuple[int, list[dict], str]:
    proc = subprocess.run([sys.executable, "-m", "dcpflow.cli", "inspect", *args], input=text,
                          capture_output=True, text=True, timeout=60)
    frames = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, frames, proc.stderr


def test_every_corrected_reference_example_decodes_through_the_cli_without_problems():
    text = "\n".join(hex_ for hex_, _ in EXAMPLES.values())
    code, frames, err = run_inspect(text, "--strict")
    assert code == 0, err
    assert len(frames) == len(EXAMPLES)
    for (name, (_, expected)), got in zip(EXAMPLES.items(), frames, strict=True):
        assert got["problems"] == [], name
        assert got["decoded"]["type"] == type(expected).__name__, name


@pytest.mark.parametrize("name", sorted(UPSTREAM_EXAMPLES))
def test_upstream_examples_are_reported_as_problems(name):
    hex_, erratum, expected = UPSTREAM_EXAMPLES[name]
    frames = inspect_bytes(parse_hex(hex_))
    reasons = [p["reason"] for f in frames for p in f["problems"]]
    assert reasons, f"erratum {erratum}: upstream bytes of {name} should be reported"
    assert any(expected in r for r in reasons), (erratum, reasons)
    for f in frames:  # a frame with a header shows its body decoded, or says why it cannot
        assert "opcode" not in f or "decoded" in f or any(
            "cannot be decoded" in p["reason"] or p["status"] == "UNKNOWN_COMMAND" for p in f["problems"]), f


@pytest.mark.parametrize("name", ["stream-request OK response", "failover-log response"])
def test_a_flagged_frame_shows_its_decoded_body_beside_its_problems(name):
    """The failover log the pages print is not newest-first (erratum 16): the frame is flagged, and
    the entries are still shown, in the order the bytes hold them, as a dissector shows them."""
    hex_, _, _ = UPSTREAM_EXAMPLES[name]
    code, frames, err = run_inspect(hex_)
    assert code == 0, err
    (f,) = frames
    entries = f["decoded"]["failover_log" if f["opcode_name"] == "DCP_STREAM_REQ" else "entries"]
    assert entries == [list(e) for e in FAILOVER_LOG_AS_PRINTED]
    assert f["decoded"]["status"] == "SUCCESS"
    assert [p["reason"] for p in f["problems"]] == [
        "failover log is not newest-first: seqnos [21554, 20197908, 4, 25892] increase"]
    code, _, _ = run_inspect(hex_, "--strict")
    assert code == 1


def test_a_body_that_cannot_be_decoded_has_only_its_problems():
    """A stream-request OK response whose failover log is 20 bytes (not N x 16) has no entries to
    show: no `decoded`, the broken rule, and a problem saying the body cannot be decoded."""
    ok = dcp.DcpStreamRequestResponse(Status.SUCCESS, ((0xABC, 7),), opaque=9).encode()
    frame = ok[:8] + (20).to_bytes(4, "big") + ok[12:] + bytes(4)
    (f,) = inspect_bytes(frame)
    assert "decoded" not in f
    assert f["opcode_name"] == "DCP_STREAM_REQ" and f["value"] == {"hex": ok[24:].hex() + "00000000"}
    assert f["problems"] == [
        {"status": "EINVAL", "reason": "failover log value must be N x 16 bytes; got 20 (failover-log.md)"},
        {"status": "EINVAL", "reason": "the body cannot be decoded as a DCP_STREAM_REQ response: failover log "
                                       "must be a multiple of 16 bytes; got 20"}]


@FUZZ
@given(near_valid_frames())
def test_inspect_describes_any_near_valid_input_without_raising(data):
    """Decoding past the rules (`rules.lenient`) reads bodies that no rule vetted: whatever they
    hold, each frame comes out decoded or with a problem saying why not."""
    for f in inspect_bytes(data):
        assert "decoded" in f or f["problems"] or "opcode" not in f, f


def test_flags_are_spelled_as_the_reference_spells_them():
    m = dcp.DcpSnapshotMarker(5, 1, 10, dcp.SnapshotFlag.MEMORY | dcp.SnapshotFlag.CHECKPOINT)
    (d,) = inspect_bytes(m.encode())
    assert d["decoded"]["flags"] == "Memory|Checkpoint"
    assert d["decoded"]["version"] == "V1"
    assert d["opcode_name"] == "DCP_SNAPSHOT_MARKER" and d["extras_length"] == 20 and d["total_body_length"] == 20
    end = dcp.DcpStreamEnd(5, dcp.StreamEndReason.STATE_CHANGED, stream_id=9)
    (d,) = inspect_bytes(end.encode())
    assert d["decoded"]["reason"] == "STATE_CHANGED"
    assert d["framing_extras"] == [{"id": 2, "name": "DCP_STREAM_ID", "payload": "0009", "stream_id": 9}]


def test_every_rule_a_frame_breaks_is_listed():
    # A mutation with a 4-byte extras section and no key: wrong extras length AND missing key.
    bad = bytes.fromhex("8057000004000000000000040000000000000000000000000000000000")[:28]
    (d,) = inspect_bytes(bad)
    reasons = " | ".join(p["reason"] for p in d["problems"])
    assert "extras must be 31 bytes; got 4" in reasons and "must have a key" in reasons


def test_truncated_and_mislength_frames_are_problems_not_crashes():
    full = dcp.DcpMutation(1, 2, 3, 0, 0, 0, b"key", b"value").encode()
    (d,) = inspect_bytes(full[:40])
    assert "truncated" in d["problems"][0]["reason"]
    (d,) = inspect_bytes(full[:10])
    assert d["problems"][0]["reason"] == "truncated header: 10 of 24 bytes"
    # Body length too small, followed by no plausible frame: the frame runs to the end, reported.
    wrong = full[:8] + (5).to_bytes(4, "big") + full[12:]
    (d,) = inspect_bytes(wrong)
    assert d["length"] == len(full)
    assert any("total body length says 5 bytes but the frame has" in p["reason"] for p in d["problems"])


def test_two_frames_and_a_garbage_tail():
    data = dcp.DcpNoop(1).encode() + dcp.DcpNoop(2).encode() + b"\x47\x45\x54"
    frames = inspect_bytes(data)
    assert [f.get("opaque") for f in frames[:2]] == ["0x00000001", "0x00000002"]
    assert frames[2]["problems"]


@pytest.mark.parametrize("text", [
    "80 5c 00 00 00 00 00 00 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 00",
    "0x80 0x5c 0x00 0x00, 0x00 0x00 0x00 0x00\n0x00000000 0x00000005 0x0000000000000000",
    "# a noop\n805c0000 00000000 | 00000000 00000005 | 0000000000000000  # trailing comment",
])
def test_hex_input_tolerates_spacing_prefixes_and_comments(text):
    assert parse_hex(text) == dcp.DcpNoop(5).encode()


def test_bad_hex_exits_2_with_a_message():
    code, frames, err = run_inspect("80 5c zz")
    assert code == 2 and frames == [] and "not a hex digit: 'z'" in err
    code, _, err = run_inspect("80 5")
    assert code == 2 and "odd number of hex digits" in err
    code, _, err = run_inspect("   ")
    assert code == 2 and "no hex bytes" in err


def test_strict_exit_code():
    bad = dcp.DcpNoop(1).encode()[:8] + (3).to_bytes(4, "big") + dcp.DcpNoop(1).encode()[12:] + b"abc"
    code, frames, _ = run_inspect(bad.hex(), "--strict")
    assert code == 1 and frames[0]["problems"]
    code, _, _ = run_inspect(bad.hex())
    assert code == 0


def test_sub_document_and_range_scan_frames_are_decoded_with_their_non_success_bodies():
    """A multi-path partial failure and a range scan's MORE frame carry bodies under non-SUCCESS
    statuses; the dissector shows them, not just the status."""
    from dcpflow.protocol import range_scan as rs
    from dcpflow.protocol import subdoc as sd
    partial = sd.SubdocMultiLookupResponse((sd.LookupResult(0, b"1"), sd.LookupResult(Status.SUBDOC_PATH_ENOENT)),
                                           5, Status.SUBDOC_MULTI_PATH_FAILURE, 3)
    more = rs.RangeScanContinueResponse(True, (b"a", b"b"), (), Status.RANGE_SCAN_MORE, 4)
    code, frames, err = run_inspect((partial.encode() + more.encode()).hex(), "--strict")
    assert code == 0, err
    lookup, scan = frames
    assert lookup["decoded"]["type"] == "SubdocMultiLookupResponse"
    assert lookup["decoded"]["results"] == [[0, "1"], [Status.SUBDOC_PATH_ENOENT, ""]]
    assert scan["decoded"]["keys"] == ["a", "b"] and scan["decoded"]["status"] == "RANGE_SCAN_MORE"
