"""The FlatBuffers tables of DCP system events (version 2 values), without the flatbuffers package.

A DCP connection that sends `flatbuffers_system_events=true` (control.md) gets system events whose
value is a FlatBuffers buffer of one table of
https://github.com/couchbase/kv_engine/blob/master/engines/ep/src/collections/events.fbs
(Collection, DroppedCollection, Scope, DroppedScope). Those tables hold only scalars and strings,
so this module writes and reads exactly that much of the format
(https://flatbuffers.dev/internals/): a root offset (u32) to the table; the table starts with an
i32 that takes the table's position to its vtable's (`vtable = table - soffset`); the vtable is a
u16 size of itself, a u16 size of the table, and one u16 offset into the table per field (0: absent,
the schema's default applies); scalars little-endian at their own alignment, a string an offset
(from where the offset is) to a u32 length, the bytes and a NUL.

`encode_table(fields)` lays out vtable, table, then strings, front to back; `decode_table(data,
kinds)` reads any valid buffer of such a table (whatever its layout), so it also reads what
kv_engine's back-to-front builder writes.
"""

import struct

from .errors import ProtocolError

#: field kinds: struct format (little-endian) of each scalar; "string" is an offset to a string
_SCALARS = {"bool": "<?", "u32": "<I", "u64": "<Q"}


def encode_table(fields: list[tuple[str, object] | None]) -> bytes:
    """One table as a whole buffer: `fields` in schema order, each (kind, value) or None (absent)."""
    nfields = len(fields)
    vt_size = 4 + 2 * nfields
    table_at = 4 + vt_size
    table_at += -table_at % 8  # room for u64 fields at their alignment
    inline: list[tuple[int, bytes]] = []  # (offset in the table, bytes)
    strings: list[tuple[int, bytes]] = []  # (offset of the uoffset in the table, string)
    offsets = [0] * nfields
    pos = 4  # after the soffset
    for i, field in enumerate(fields):
        if field is None:
            continue
        kind, value = field
        if kind == "string":
            size, raw = 4, b""
        else:
            raw = struct.pack(_SCALARS[kind], value)
            size = len(raw)
        pos += -(table_at + pos) % size
        offsets[i] = pos
        if kind == "string":
            strings.append((pos, value.encode() if isinstance(value, str) else bytes(value)))
        else:
            inline.append((pos, raw))
        pos += size
    table_size = pos
    out = bytearray(table_at + table_size)
    struct.pack_into("<I", out, 0, table_at)
    struct.pack_into(f"<HH{nfields}H", out, 4, vt_size, table_size, *offsets)
    struct.pack_into("<i", out, table_at, table_at - 4)
    for off, raw in inline:
        out[table_at + off:table_at + off + len(raw)] = raw
    for off, raw in strings:
        out += b"\0" * (-len(out) % 4)
        at = len(out)
        struct.pack_into("<I", out, table_at + off, at - (table_at + off))
        out += struct.pack("<I", len(raw)) + raw + b"\0"
    out += b"\0" * (-len(out) % 4)
    return bytes(out)


def decode_table(data: bytes, kinds: list[str]) -> list:
    """The fields of the buffer's root table, in schema order (`kinds`, as for encode_table);
    None for an absent field. ProtocolError when the buffer is not such a table."""
    try:
        table = struct.unpack_from("<I", data, 0)[0]
        vtable = table - struct.unpack_from("<i", data, table)[0]
        vt_size, _ = struct.unpack_from("<HH", data, vtable)
        out: list = []
        for i, kind in enumerate(kinds):
            at = 4 + 2 * i
            off = struct.unpack_from("<H", data, vtable + at)[0] if at < vt_size else 0
            if not off:
                out.append(None)
            elif kind == "string":
                ref = table + off
                start = ref + struct.unpack_from("<I", data, ref)[0]
                n = struct.unpack_from("<I", data, start)[0]
                if start + 4 + n > len(data):
                    raise ProtocolError("a FlatBuffers string runs past the buffer")
                out.append(bytes(data[start + 4:start + 4 + n]))
            else:
                out.append(struct.unpack_from(_SCALARS[kind], data, table + off)[0])
        return out
    except struct.error:
        raise ProtocolError(f"a FlatBuffers table of {len(data)} bytes does not hold what its offsets say") from None
