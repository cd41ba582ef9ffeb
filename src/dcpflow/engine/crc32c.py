"""CRC-32C (Castagnoli, RFC 3720 appendix B.4): the checksum of `${Mutation.value_crc32c}` and of
`$document.value_crc32c` (docs/ExtendedAttributes.md). Table-driven, one byte per step; only
sub-document requests that name the checksum pay for it."""

_POLY = 0x82F63B78  # the reflected Castagnoli polynomial


def _table() -> tuple[int, ...]:
    out = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        out.append(crc)
    return tuple(out)


_TABLE = _table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """The CRC-32C of `data` (continuing from `crc`)."""
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
