"""`dcpflow inspect`: the real console script on the reference examples (corrected: decodes with no
problem; upstream: reports the erratum), plus input tolerance and exit codes."""

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


# ---------------------------------------------------------------------------------------------
# packet tables pasted from KV-Engine's pages (docs/cli.md promises they work as is)

#: https://github.com/couchbase/kv_engine/blob/master/docs/sasl.md (LIST_MECH response), as printed:
#: character notes in the cells, a `Total` line with words after it.
SASL_LIST_MECH_RESPONSE = """
      Byte/     0       |       1       |       2       |       3       |
         /              |               |               |               |
        |0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|
        +---------------+---------------+---------------+---------------+
       0| 0x81          | 0x20          | 0x00          | 0x00          |
        +---------------+---------------+---------------+---------------+
       4| 0x00          | 0x00          | 0x00          | 0x00          |
        +---------------+---------------+---------------+---------------+
       8| 0x00          | 0x00          | 0x00          | 0x19          |
        +---------------+---------------+---------------+---------------+
      12| 0x00          | 0x00          | 0x00          | 0x00          |
        +---------------+---------------+---------------+---------------+
      16| 0x00          | 0x00          | 0x00          | 0x00          |
        +---------------+---------------+---------------+---------------+
      20| 0x00          | 0x00          | 0x00          | 0x00          |
        +---------------+---------------+---------------+---------------+
      24| 0x53 ('S')    | 0x43 ('C')    | 0x52 ('R')    | 0x41 ('A')    |
        +---------------+---------------+---------------+---------------+
      28| 0x4d ('M')    | 0x2d ('-')    | 0x53 ('S')    | 0x48 ('H')    |
        +---------------+---------------+---------------+---------------+
      32| 0x41 ('A')    | 0x31 ('1')    | 0x20 (' ')    | 0x43 ('C')    |
        +---------------+---------------+---------------+---------------+
      36| 0x52 ('R')    | 0x41 ('A')    | 0x4d ('M')    | 0x2d ('-')    |
        +---------------+---------------+---------------+---------------+
      40| 0x4d ('M')    | 0x44 ('D')    | 0x35 ('5')    | 0x20 (' ')    |
        +---------------+---------------+---------------+---------------+
      44| 0x50 ('P')    | 0x4c ('L')    | 0x41 ('A')    | 0x49 ('I')    |
        +---------------+---------------+---------------+---------------+
      48| 0x4e ('N')    |
        +---------------+
        Total 49 bytes (24 bytes header and 25 value)
"""

#: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/no-op.md: the
#: request and the response tables with the page's breakdown between them. Bare hex digits in the
#: cells; the request table draws a 28th byte row its header does not count (a page erratum).
NOOP_PAGE = """
    Byte/     0       |       1       |       2       |       3       |
       /              |               |               |               |
      |0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|
      +---------------+---------------+---------------+---------------+
     0|       80      |       5C      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
     4|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
     8|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
    12|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
    16|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
    20|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
    24|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+

    Header breakdown
    Dcp No-Op command
    Field        (offset) (value)
    Magic        (0)    : 0x80                (Request)
    Opcode       (1)    : 0x5C                (Dcp No-Op)
    Key length   (2,3)  : 0x0000              (0)
    Total body   (8-11) : 0x00000000          (0)
    Byte/     0       |       1       |       2       |       3       |
       /              |               |               |               |
      |0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|
      +---------------+---------------+---------------+---------------+
     0|       81      |       5C      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
     4|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
     8|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
    12|       00      |       00      |       00      |       05      |
      +---------------+---------------+---------------+---------------+
    16|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
    20|       00      |       00      |       00      |       00      |
      +---------------+---------------+---------------+---------------+
"""

#: https://github.com/couchbase/kv_engine/blob/master/docs/range_scans/range_scan_continue.md: the
#: character first in a cell, a merged rule, and the page's `...` for rows left out.
RANGE_SCAN_KEYS = """
     Byte/     0       |       1       |       2       |       3       |
        /              |               |               |               |
       |0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|
       +---------------+---------------+---------------+---------------+
      0| 0x04          | 'k' 0x6B      | 'e' 0x65      | 'y' 0x79      |
       +---------------+---------------+---------------+---------------+
      4| '0' 0x30      | 0x05          | 'k' 0x6B      | 'e' 0x65      |
       +---------------+---------------+---------------+---------------+
      8| 'y' 0x79      | '1' 0x31      | '1' 0x31      | 0x80          |
       +---------------+---------------+-------------------------------+
       ...
       +---------------+
    140| '3' 0x33      |
       +---------------+
       Total 140bytes
"""

#: https://github.com/couchbase/kv_engine/blob/master/docs/Collections.md: three columns.
LEB128_0x5555 = """
  Byte/     0       |       1       |       2       |
     /              |               |               |
    |0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|
    +---------------+---------------+---------------+
   0| 0xD5          | 0xAA          | 0x01          |
    +---------------+---------------+---------------+
"""

#: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/buffer-ack.md:
#: a table of field names, not bytes.
BUFFER_ACK_LAYOUT = """
     Byte/     0       |       1       |       2       |       3       |
        /              |               |               |               |
       |0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|
       +---------------+---------------+---------------+---------------+
      0| bytes to ack                                                  |
       +---------------+---------------+---------------+---------------+
"""


def test_a_pasted_table_with_character_notes_decodes():
    code, frames, err = run_inspect(SASL_LIST_MECH_RESPONSE, "--strict")
    assert code == 0, err
    assert [(f["opcode_name"], f["status"], f["value"], f["problems"]) for f in frames] == [
        ("SASL_LIST_MECHS", "SUCCESS", "SCRAM-SHA1 CRAM-MD5 PLAIN", [])]


def test_a_pasted_page_section_reads_each_table_and_skips_the_breakdown():
    """Row offsets (`0|`, `4|`, `24|`) are labels, not bytes; the prose between the tables is
    skipped; the page's extra row is reported, not refused."""
    code, frames, err = run_inspect(NOOP_PAGE)
    assert code == 0, err
    assert [(f["offset"], f["magic_name"], f["opcode_name"]) for f in frames] == [
        (0, "REQUEST", "DCP_NOOP"), (28, "RESPONSE", "DCP_NOOP")]
    assert frames[1]["opaque"] == "0x00000005" and frames[1]["problems"] == []
    assert frames[0]["length"] == 28
    assert frames[0]["problems"][0]["reason"] == "total body length says 0 bytes but the frame has 4"


def test_every_cell_style_of_the_pages():
    assert parse_hex(RANGE_SCAN_KEYS) == bytes.fromhex("046b6579 30056b65 79313180 33")
    assert parse_hex(LEB128_0x5555) == b"\xd5\xaa\x01"
    two = parse_hex(SASL_LIST_MECH_RESPONSE + LEB128_0x5555)
    assert len(two) == 52 and two.endswith(b"N\xd5\xaa\x01")
    # a tab-indented paste, notes with a closing bar inside, and text after the last bar
    assert parse_hex("\t+---+---+\n\t0| 0x7c ('|') | 0x27 (''') |  <- two bytes\n") == b"|'"


def test_a_table_of_field_names_is_refused_with_its_line():
    code, frames, err = run_inspect(BUFFER_ACK_LAYOUT)
    assert code == 2 and frames == []
    assert "line 6: 'bytes' in a table row is not a byte" in err


def _drawn(data: bytes, style: str, columns: int) -> str:
    """`data` drawn as the pages draw a packet, in one of their cell styles."""
    def cell(b: int) -> str:
        char = chr(b) if 0x20 <= b < 0x7f else None
        text = {"bare": f"{b:02X}", "hex": f"0x{b:02x}", "note": f"0x{b:02x}" + (f" ('{char}')" if char else ""),
                "char-first": (f"'{char}' " if char else "") + f"0x{b:02X}"}[style]
        return f" {text:<14}"

    rule = "       +" + "---------------+" * columns
    lines = ["     Byte/" + "".join(f"     {i}       |" for i in range(columns)),
             "        /" + "              |" * columns,
             "       |" + "0 1 2 3 4 5 6 7|" * columns, rule]
    for at in range(0, len(data), columns):
        lines.append(f"{at:>7}|" + "|".join(cell(b) for b in data[at:at + columns]) + "|")
        lines.append(rule)
    lines.append(f"       Total {len(data)} bytes")
    return "\n".join(lines) + "\n"


@given(st.binary(max_size=80), st.sampled_from(["bare", "hex", "note", "char-first"]), st.integers(1, 4))
def test_any_bytes_drawn_as_a_table_read_back(data, style, columns):
    assert parse_hex(_drawn(data, style, columns)) == data
