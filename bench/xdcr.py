"""Cross-cluster replication throughput: items/s `dcpflow.replication.xdcr` replicates from one
dcpflow server to another, against the rate the same target absorbs a raw pipelined SetWithMeta
load of the same documents (the replicator's ceiling: it cannot write faster than the target
takes *WithMeta writes), measured in the same run.

* The source serves N documents built on disk before it starts (bench/serverproc.build_data).
* The target serves two empty buckets: `raw` takes the baseline, `default` the replication.
* Baseline: the documents' SetWithMeta frames (flags, expiry, rev seqno, CAS and datatype as the
  source holds them), encoded beforehand, sent over one connection in windows of 512 with two in flight;
  items/s from the first send to the last reply.
* Replication: an XdcrReplicator in this process, from a fresh state directory; items/s from its
  start (connect, streams, first writes included) until the target acknowledged all N.
  The figure is their ratio (the goal is 0.5 or more).

    .venv/bin/python bench/xdcr.py                 # 100k documents of 200 bytes, 64 vbuckets
    .venv/bin/python bench/xdcr.py --docs 300000 --value-size 1000
    .venv/bin/python bench/xdcr.py --smoke         # seconds: 2000 documents, 16 vbuckets
"""

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.meta import GetMeta, GetMetaResponse, SetWithMeta
from dcpflow.protocol.status import Status
from serverproc import build_data, cpu_seconds, login, next_frame, start_server, stop

WINDOW = 512


def connect(port: int, bucket: str):
    # the documents are sent with their JSON datatype
    return login(port, b"bench/xdcr", bucket, (Feature.TCP_NODELAY, Feature.JSON))


def source_frames(port: int, docs: int, value: bytes, vbuckets: int) -> list[bytes]:
    """The SetWithMeta frames of the source's documents, with the metadata the source holds."""
    sock, d = connect(port, "default")
    frames = []
    try:
        for start in range(0, docs, WINDOW):
            keys = [b"doc-%09d" % i for i in range(start, min(docs, start + WINDOW))]
            sock.sendall(b"".join(GetMeta(k, 2, vbucket_for_key(k, vbuckets)).encode() for k in keys))
            for key in keys:
                meta = GetMetaResponse.from_frame(next_frame(sock, d))
                assert meta.status == Status.SUCCESS, (key, meta)
                frames.append(SetWithMeta(key, value, meta.flags, meta.expiry, meta.rev_seqno, meta.cas,
                                          vbucket=vbucket_for_key(key, vbuckets), datatype=meta.datatype or 0).encode())
    finally:
        sock.close()
    return frames


def raw_load(port: int, frames: list[bytes]) -> float:
    """Items/s of the frames into bucket `raw`, windows of WINDOW, two in flight."""
    sock, d = connect(port, "raw")
    windows = [b"".join(frames[i:i + WINDOW]) for i in range(0, len(frames), WINDOW)]
    sizes = [len(frames[i:i + WINDOW]) for i in range(0, len(frames), WINDOW)]
    began = time.perf_counter()
    sock.sendall(windows[0])
    for i in range(len(windows)):
        if i + 1 < len(windows):
            sock.sendall(windows[i + 1])
        for _ in range(sizes[i]):
            reply = next_frame(sock, d)
            assert reply.status == Status.SUCCESS, reply
    elapsed = time.perf_counter() - began
    sock.close()
    return len(frames) / elapsed


async def replicate(src: int, dst: int, docs: int, state_dir: str) -> float:
    from dcpflow.replication.xdcr import Settings, XdcrReplicator
    rep = XdcrReplicator(f"couchbase://127.0.0.1:{src}/default", f"couchbase://127.0.0.1:{dst}/default",
                         username="Administrator", password="password", state_dir=state_dir,
                         settings=Settings(conflict_resolution="seqno", checkpoint_interval=5.0))
    stop_event = asyncio.Event()
    began = time.perf_counter()
    task = asyncio.create_task(rep.run(stop_event))
    while rep.stats["docs_written"] < docs:
        if task.done():
            task.result()
            raise RuntimeError("the replicator stopped early")
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - began
    stop_event.set()
    await task
    assert rep.stats["failed_cr_target"] == 0 and rep.stats["docs_failed"] == 0, rep.stats
    return docs / elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--value-size", type=int, default=200)
    p.add_argument("--vbuckets", type=int, default=64)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs; the figure means nothing")
    args = p.parse_args()
    if args.smoke:
        args.docs, args.vbuckets = 2000, 16
    value = b'{"pad":"' + b"x" * max(0, args.value_size - 10) + b'"}'
    root = tempfile.mkdtemp(prefix="bench-xdcr-")
    procs = []
    try:
        build_data(os.path.join(root, "source"), args.docs, value, args.vbuckets, datatype=1)
        src, src_port = start_server(os.path.join(root, "source"), args.vbuckets)
        procs.append(src)
        dst, dst_port = start_server(os.path.join(root, "target"), args.vbuckets, "--bucket", "default",
                                     "--bucket", "raw")
        procs.append(dst)
        frames = source_frames(src_port, args.docs, value, args.vbuckets)
        dst_cpu = cpu_seconds(dst.pid)
        raw = raw_load(dst_port, frames)
        raw_target_cpu = cpu_seconds(dst.pid) - dst_cpu
        cpu = (cpu_seconds(src.pid), cpu_seconds(dst.pid), sum(os.times()[:2]))
        try:  # the event loop `dcpflow xdcr` runs on when uvloop is installed
            import uvloop
            run = uvloop.run
        except ImportError:
            run = asyncio.run
        rate = run(replicate(src_port, dst_port, args.docs, os.path.join(root, "state")))
        used = [after - before for before, after in
                zip(cpu, (cpu_seconds(src.pid), cpu_seconds(dst.pid), sum(os.times()[:2])), strict=True)]
        print(f"{args.docs} documents of {len(value)} bytes, {args.vbuckets} vbuckets")
        per = 1e6 / args.docs
        print(f"CPU µs per document: raw load target {raw_target_cpu * per:.0f}; replication source "
              f"{used[0] * per:.0f}, replicator {used[2] * per:.0f}, target {used[1] * per:.0f}")
        print(f"raw pipelined SetWithMeta into the target: {raw:,.0f} items/s")
        print(f"dcpflow xdcr dcpflow->dcpflow:            {rate:,.0f} items/s")
        print(f"ratio xdcr / raw SetWithMeta: {rate / raw:.2f}")
    finally:
        for proc in procs:
            stop(proc)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
