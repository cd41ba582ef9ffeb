"""`dcpflow inspect`: decode hex dumps of protocol traffic into one JSON object per frame.

For a person debugging a DCP stream: every header field by name, the typed body with flags spelled
as KV-Engine's documentation spells them, and a `problems` list naming each rule a frame breaks.
As in a dissector, a frame that breaks a rule still shows its body as the bytes read; only a body
too short for its fields has none, and a problem says why.

Input copied from a page or a packet capture is often slightly wrong (several of KV-Engine's
documented examples miscount their body lengths), so framing is lenient: when the declared body
length does not lead to a plausible next frame (its parts do not fit in it, or a full-size
non-header follows), the frame is taken to run to the next plausible header (or the end), and the
mismatch is reported as a problem rather than a crash. A tail too short for a header is reported
on its own.
"""

import json
import re
import struct
from collections.abc import Iterator
from enum import IntEnum, IntFlag

from .protocol import dcp, kv, meta, rules
from .protocol.datatype import Datatype
from .protocol.errors import ProtocolError
from .protocol.frame import (
    ALT_HEADER,
    HEADER,
    HEADER_LEN,
    MAGIC_OPCODE_BODY,
    Frame,
    Magic,
    RequestFrameId,
    ResponseFrameId,
    parse_stream_id,
)
from .protocol.hello import Feature
from .protocol.messages import decode_message
from .protocol.opcodes import OPCODE_DESCRIPTIONS, Opcode
from .protocol.status import STATUS_DESCRIPTIONS, Status

_MAGICS = {int(m) for m in Magic}
_HEX_TOKEN = re.compile(r"0[xX]")
_COMMENT = re.compile(r"#[^\n]*")


#: A packet table as KV-Engine's protocol pages draw them: a `Byte/` header, or `+---+` rules.
_TABLE = re.compile(r"^[ \t]*(?:Byte/|\+-)", re.M)
#: A table row: its byte offset (a label: the pages sometimes miscount it), then the cells. Lines
#: led by a bare bar (the header's bit numbers, markdown tables) are not rows.
_ROW = re.compile(r"^\s*\d+\s*\|(.*)$")
#: A cell's character notes: `0x68 ('h')`, `'k' 0x6B`, `('_', 0x5F)`.
_CHAR_NOTE = re.compile(r"\(\s*'.'[^)\n]*\)|'.'")
_BYTES = re.compile(r"(?:0[xX])?((?:[0-9a-fA-F]{2})+)")


def parse_hex(text: str) -> bytes:
    """Bytes from a hex dump: whitespace, commas, `0x` prefixes, `#` comments and `|` grid bars are
    ignored, so a dump pasted from a page or a capture works as is. Input with a packet table of
    KV-Engine's pages (a `Byte/` header or `+---+` rules) is read as tables (`_table_bytes`)."""
    if _TABLE.search(text):
        return _table_bytes(text)
    text = _COMMENT.sub(" ", text)
    text = _HEX_TOKEN.sub("", text)
    digits = re.sub(r"[\s,|:;]", "", text)
    bad = re.search(r"[^0-9a-fA-F]", digits)
    if bad:
        raise ValueError(f"not a hex digit: {bad.group()!r} at position {bad.start()} of the cleaned input")
    if len(digits) % 2:
        raise ValueError(f"odd number of hex digits ({len(digits)}): a byte is missing a digit")
    return bytes.fromhex(digits)


def _table_bytes(text: str) -> bytes:
    """The bytes of the packet tables in `text`, row after row, table after table, as KV-Engine's
    pages draw them (e.g. docs/dcp/documentation/commands/mutation.md):

            Byte/     0       |       1       |       2       |       3       |
               /              |               |               |               |
              |0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|
              +---------------+---------------+---------------+---------------+
             0| 0x80          | 0x57          | 0x00          | 0x05          |
              ...
            52| 0x00          | 0x00          | 0x00          | 0x68 ('h')    |
              +---------------+---------------+---------------+---------------+
              Total 65 bytes

    A row is `offset|cell|cell|...|`; a cell holds a byte as `80` or `0x80`, with or without a
    character note. The offsets are labels only (pages miscount some), and everything that is
    not a row (the header, rules, `Total N bytes`, `...`, the field breakdown and prose around
    the tables) is skipped. A row cell that is not bytes (a layout table names its fields) is a
    ValueError naming the line."""
    out = bytearray()
    for number, line in enumerate(text.splitlines(), 1):
        row = _ROW.match(line)
        if row is None:
            continue
        cells = _COMMENT.sub("", _CHAR_NOTE.sub(" ", row.group(1)))  # notes first: ('#') is a note
        if "|" in cells:  # anything after the closing bar is a note
            cells = cells[:cells.rindex("|")]
        for token in cells.replace("|", " ").split():
            match = _BYTES.fullmatch(token)
            if match is None:
                raise ValueError(f"line {number}: {token!r} in a table row is not a byte (a table of field names, "
                                 f"not of bytes?)")
            out += bytes.fromhex(match.group(1))
    return bytes(out)


def _plausible_start(data: bytes, pos: int) -> bool:
    return pos == len(data) or (len(data) - pos >= HEADER_LEN and data[pos] in _MAGICS)


def split_frames(data: bytes) -> Iterator[tuple[int, int, list[str]]]:
    """(offset, length, framing problems) per frame, leniently (see module docstring)."""
    pos, prev_body_len = 0, None
    while pos < len(data):
        problems = []
        remaining = len(data) - pos
        if remaining < HEADER_LEN:
            if prev_body_len is None:
                yield pos, remaining, [f"truncated header: {remaining} of 24 bytes"]
            else:
                yield pos, remaining, [f"{remaining} trailing bytes are too short for a 24-byte header: does the "
                                       f"previous frame's total body length ({prev_body_len}) undercount its body?"]
            return
        magic = data[pos]
        if magic not in _MAGICS:
            problems.append(f"invalid magic 0x{magic:02x}: the rest of the input cannot be framed")
            yield pos, remaining, problems
            return
        body_len = MAGIC_OPCODE_BODY(data, pos)[2]
        declared_end = pos + HEADER_LEN + body_len
        if declared_end > len(data):
            if _parts_len(data, pos) <= remaining - HEADER_LEN:
                problems.append(f"total body length says {body_len} bytes but only {remaining - HEADER_LEN} "
                                f"follow the header")
            else:
                problems.append(f"truncated frame: header says {body_len} body bytes, only "
                                f"{remaining - HEADER_LEN} present")
            yield pos, remaining, problems
            return
        end = declared_end
        short_tail = len(data) - declared_end < HEADER_LEN
        if _parts_len(data, pos) > body_len or not (short_tail or _plausible_start(data, declared_end)):
            # The declared length is wrong; the frame runs to the next plausible header.
            end = next((p for p in range(pos + HEADER_LEN + _parts_len(data, pos), len(data) + 1)
                        if _plausible_start(data, p) and p >= pos + HEADER_LEN), len(data))
            actual = end - pos - HEADER_LEN
            problems.append(f"total body length says {body_len} bytes but the frame has {actual}")
        yield pos, end - pos, problems
        pos, prev_body_len = end, body_len


def _parts_len(data: bytes, pos: int) -> int:
    """framing + extras + key lengths from the header at pos."""
    magic = data[pos]
    if magic in (Magic.ALT_REQUEST, Magic.ALT_RESPONSE):
        _, _, framing_len, key_len, ext_len, *_ = ALT_HEADER.unpack_from(data, pos)
        return framing_len + key_len + ext_len
    _, _, key_len, ext_len, *_ = HEADER.unpack_from(data, pos)
    return key_len + ext_len


def _frame_of(chunk: bytes) -> tuple[Frame, dict]:
    """The Frame for a chunk, built from the actual bytes, plus the raw header fields."""
    magic = chunk[0]
    if magic in (Magic.ALT_REQUEST, Magic.ALT_RESPONSE):
        _, opcode, fl, kl, el, dt, vbs, bl, opaque, cas = ALT_HEADER.unpack_from(chunk)
    else:
        _, opcode, kl, el, dt, vbs, bl, opaque, cas = HEADER.unpack_from(chunk)
        fl = 0
    p = HEADER_LEN
    body = chunk[p:]
    f = body[:fl]
    e = body[fl:fl + el]
    k = body[fl + el:fl + el + kl]
    v = body[fl + el + kl:]
    header = {"framing_extras_length": fl, "key_length": kl, "extras_length": el, "total_body_length": bl}
    return Frame(magic, opcode, dt, vbs, opaque, cas, f, e, k, v), header


def _render_bytes(b: bytes):
    if not b:
        return ""
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": b.hex()}
    if all(c.isprintable() for c in text):
        return text
    return {"hex": b.hex()}


_FLAG_FIELDS: dict[tuple[type, str], type] = {
    (dcp.DcpOpen, "flags"): dcp.OpenFlag,
    (dcp.DcpAddStream, "flags"): dcp.StreamFlag,
    (dcp.DcpStreamRequest, "flags"): dcp.StreamFlag,
    (dcp.DcpSnapshotMarker, "flags"): dcp.SnapshotFlag,
    (dcp.DcpOsoSnapshot, "flags"): dcp.OsoFlag,
    (dcp.DcpStreamEnd, "reason"): dcp.StreamEndReason,
    (dcp.DcpSetVbucketState, "state"): dcp.VBucketState,
    (dcp.DcpSystemEvent, "event"): dcp.SystemEventId,
    (dcp.DcpPrepare, "durability_level"): dcp.DurabilityLevel,
    (meta.SetWithMeta, "options"): meta.WithMetaOption,
    (meta.DelWithMeta, "options"): meta.WithMetaOption,
    (kv.SetVbucket, "state"): dcp.VBucketState,
    (kv.GetVbucketResponse, "state"): dcp.VBucketState,
}

_MARKER_VERSION_NAMES = {dcp.MarkerVersion.V1: "V1", dcp.MarkerVersion.V2_0: "V2.0", dcp.MarkerVersion.V2_2: "V2.2"}


def _render_value(v):
    if isinstance(v, bytes):
        return _render_bytes(v)
    if isinstance(v, tuple | list):
        return [_render_value(x) for x in v]
    if isinstance(v, IntEnum):
        return v.name
    return v


def describe_message(msg) -> dict:
    out = {"type": type(msg).__name__}
    for name, value in zip(msg._fields, msg, strict=True):
        enum = _FLAG_FIELDS.get((type(msg), name))
        if value is None:
            out[name] = None
        elif enum is not None and issubclass(enum, IntFlag):
            out[name] = dcp.spell_flags(value, enum)
        elif enum is not None:
            try:
                out[name] = enum(value).name
            except ValueError:
                out[name] = f"unknown ({value})"
        elif name == "version" and isinstance(msg, dcp.DcpSnapshotMarker):
            out[name] = _MARKER_VERSION_NAMES.get(value, value)
        elif name == "features":
            out[name] = [Feature(f).name if f in Feature._value2member_map_ else f"0x{f:04x}" for f in value]
        elif name == "status":
            out[name] = Status(value).name if value in Status._value2member_map_ else value
        elif name == "datatype":
            out[name] = dcp.spell_flags(value, Datatype) if value else "Raw"
        elif name == "value" and isinstance(value, bytes) and value[:1] in (b"{", b"["):
            try:
                out[name] = json.loads(value)
            except ValueError:
                out[name] = _render_bytes(value)
        else:
            out[name] = _render_value(value)
    if isinstance(msg, dcp.DcpSystemEvent):
        try:
            out["event_data"] = msg.decode_value()
        except ProtocolError as e:
            out["event_data_error"] = e.reason
    return out


def _frame_infos(frame: Frame) -> list[dict]:
    ids = ResponseFrameId if frame.is_response else RequestFrameId
    out = []
    for fid, payload in frame.frame_infos:
        item = {"id": fid, "name": ids(fid).name if fid in ids._value2member_map_ else "UNKNOWN",
                "payload": payload.hex()}
        if not frame.is_response and fid == RequestFrameId.DCP_STREAM_ID and len(payload) == 2:
            item["stream_id"] = parse_stream_id(payload)
        out.append(item)
    return out


def describe(chunk: bytes, offset: int = 0, framing_problems: list[str] | None = None) -> dict:
    """A JSON-ready description of one frame's bytes."""
    out: dict = {"offset": offset, "length": len(chunk)}
    problems = [{"status": "EINVAL", "reason": p} for p in (framing_problems or [])]
    if len(chunk) < HEADER_LEN or chunk[0] not in _MAGICS:
        out["bytes"] = chunk.hex()
        out["problems"] = problems
        return out
    frame, header = _frame_of(chunk)
    out["magic"] = f"0x{frame.magic:02x}"
    out["magic_name"] = Magic(frame.magic).name
    out["opcode"] = f"0x{frame.opcode:02x}"
    try:
        out["opcode_name"] = Opcode(frame.opcode).name
        out["opcode_meaning"] = OPCODE_DESCRIPTIONS[frame.opcode]
    except ValueError:
        out["opcode_name"] = "UNKNOWN"
    out.update(header)
    out["datatype"] = dcp.spell_flags(frame.datatype, Datatype) if frame.datatype else "Raw"
    if frame.is_response:
        st = frame.status
        out["status"] = Status(st).name if st in Status._value2member_map_ else f"0x{st:04x}"
        if st in STATUS_DESCRIPTIONS:
            out["status_meaning"] = STATUS_DESCRIPTIONS[st]
    else:
        out["vbucket"] = frame.vbucket
    out["opaque"] = f"0x{frame.opaque:08x}"
    out["cas"] = frame.cas
    if frame.framing:
        try:
            out["framing_extras"] = _frame_infos(frame)
        except ProtocolError as e:
            problems.append({"status": e.status.name, "reason": e.reason})
    out["extras"] = frame.extras.hex()
    out["key"] = _render_bytes(frame.key)
    out["value"] = _render_bytes(frame.value)
    for p in rules.problems(frame):
        problems.append({"status": p.status.name if isinstance(p.status, Status) else p.status,
                         "reason": p.reason})
    if not any(p["status"] == "UNKNOWN_COMMAND" for p in problems):
        decoded, problem = _decode(frame)
        if problem is None:
            out["decoded"] = decoded
        else:
            problems.append(problem)
    out["problems"] = problems
    return out


def _decode(frame: Frame) -> tuple[dict | None, dict | None]:
    """(the typed message described, None), or (None, the problem that stopped the decoder).

    The rules do not stop it (`rules.lenient`): a frame that breaks one still shows what its body
    says beside its problems, as a dissector does. Only a body whose layout cannot be read at all
    (a failover log of 20 bytes, extras too short for their fields) has no `decoded`, and its
    problem says so."""
    what = f"{rules.opcode_name(frame.opcode)} {'response' if frame.is_response else 'request'}"
    try:
        with rules.lenient():
            return describe_message(decode_message(frame)), None
    except ProtocolError as e:
        if e.status == Status.UNKNOWN_COMMAND:  # a known opcode this package has no type for
            return None, {"status": e.status.name, "reason": e.reason}
        status = e.status.name if isinstance(e.status, Status) else e.status
        return None, {"status": status, "reason": f"the body cannot be decoded as a {what}: {e.reason}"}
    except (ValueError, struct.error, IndexError) as e:  # e.g. a JSON value that is not JSON
        return None, {"status": "EINVAL", "reason": f"the body cannot be decoded as a {what}: {e}"}


def inspect_bytes(data: bytes) -> list[dict]:
    return [describe(data[o:o + n], o, p) for o, n, p in split_frames(data)]
