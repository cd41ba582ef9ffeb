"""Codec throughput: decode and encode DCP mutations, against a floor measured in the same run.

The floor is a bare loop that only walks frame boundaries (reads each body length and jumps) over the
same bytes: no decoder in pure Python can do less per frame. The ratio decode/floor is the figure to
watch; absolute rates depend on the machine.

    python bench/codec.py [--frames 1000000] [--chunk 65536]
    python bench/codec.py --smoke        # seconds: 2,000 mutations, one round
"""

import argparse
import gc
import json
import random
import struct
import sys
import time

from dcpflow.protocol.dcp import DcpDecoder, DcpMutation, DcpSnapshotMarker, SnapshotFlag

KINDS = ("user", "order", "product", "session")


def make_messages(n: int, seed: int = 7) -> list:
    """Realistic stream: keys like `order::00012345`, ~256-byte JSON values, a marker every 1000."""
    rnd = random.Random(seed)
    values = []
    for i in range(64):  # a pool of distinct values keeps generation fast
        doc = {"id": i, "type": KINDS[i % 4], "name": f"name-{rnd.randrange(10**6)}",
               "email": f"u{rnd.randrange(10**6)}@example.com", "active": bool(i % 2),
               "score": rnd.random(), "tags": ["alpha", "beta", "gamma"][: 1 + i % 3],
               "address": {"city": "Springfield", "zip": f"{rnd.randrange(10**5):05d}"}}
        raw = json.dumps(doc, separators=(",", ":"))
        values.append((raw + " " * max(0, 256 - len(raw))).encode())
    out = []
    vb = 0
    for i in range(n):
        if i % 1000 == 0:
            out.append(DcpSnapshotMarker(vb, i + 1, i + 1000, SnapshotFlag.MEMORY | SnapshotFlag.CHECKPOINT))
        key = f"{KINDS[i % 4]}::{rnd.randrange(10**8):08d}".encode()
        out.append(DcpMutation(vb, i + 1, 1 + i % 7, 0x02000006, 0, 0, key, values[i % 64],
                               cas=1_700_000_000_000_000_000 + i, datatype=1, opaque=0x1000 + vb))
    return out


def floor(buf: bytes) -> int:
    u32 = struct.Struct(">I").unpack_from
    pos, end, n = 0, len(buf), 0
    while pos < end:
        pos += 24 + u32(buf, pos + 8)[0]
        n += 1
    return n


def decode_whole(buf: bytes) -> int:
    dec = DcpDecoder()
    dec.feed(buf)
    n = 0
    for _ in dec.messages():
        n += 1
    return n


def decode_chunked(buf: bytes, chunk: int) -> int:
    dec = DcpDecoder()
    n = 0
    mv = memoryview(buf)
    for i in range(0, len(buf), chunk):
        dec.feed(mv[i:i + chunk])
        for _ in dec.messages():
            n += 1
    return n


def decode_and_touch(buf: bytes) -> int:
    """Decode and read the fields a consumer always reads (key, seqno, vbucket): the honest cost."""
    dec = DcpDecoder()
    dec.feed(buf)
    total = 0
    for m in dec.messages():
        if m.opcode == 0x57:
            total += m.by_seqno + len(m.key) + m.vbucket
    return total


def encode_all(messages) -> int:
    size = 0
    for m in messages:
        size += len(m.encode())
    return size


def timed(fn, *args, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=1_000_000, help="mutations in the stream")
    ap.add_argument("--chunk", type=int, default=65536, help="bytes per feed() in the chunked decode")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run that checks the bench works")
    args = ap.parse_args(argv)
    if args.smoke:
        args.frames, args.repeat = 2_000, 1

    print(f"building {args.frames:,} mutations ...", file=sys.stderr)
    messages = make_messages(args.frames)
    buf = b"".join(m.encode() for m in messages)
    n_frames = len(messages)
    assert floor(buf) == n_frames == decode_whole(buf) == decode_chunked(buf, args.chunk)
    print(f"stream: {n_frames:,} frames ({args.frames:,} mutations + markers), {len(buf) / 1e6:.1f} MB, "
          f"{len(buf) / n_frames:.0f} B/frame")

    t_floor = timed(floor, buf, repeat=args.repeat)
    rows = [
        ("floor: walk frame boundaries", t_floor),
        ("decode to typed messages (one buffer)", timed(decode_whole, buf, repeat=args.repeat)),
        (f"decode, fed {args.chunk // 1024} KiB chunks", timed(decode_chunked, buf, args.chunk, repeat=args.repeat)),
        ("decode + read key/seqno/vbucket", timed(decode_and_touch, buf, repeat=args.repeat)),
        ("encode typed messages", timed(encode_all, messages, repeat=args.repeat)),
    ]
    print(f"{'':42} {'frames/s':>12} {'MB/s':>8} {'x floor':>8}")
    for name, t in rows:
        print(f"{name:42} {n_frames / t:>12,.0f} {len(buf) / t / 1e6:>8.0f} {t / t_floor:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
