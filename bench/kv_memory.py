"""The bucket's memory from outside: what `dcpflow server` spends per document, and its resident
memory under loads that would grow it without a quota. Three cases, each against a fresh server
subprocess:

* density: `--items` (100k and 1M) documents with 15-byte keys and `--density-value-size` (310)
  byte JSON values, the shape of issue 46's measurement, SET into a bucket whose quota
  (`--density-quota`, 8g) evicts nothing, then persisted. Prints the engine's own metadata
  accounting per item (STAT ep_meta_data_memory, `kv_ep_meta_data_memory_bytes` in /metrics) and
  what it spends beyond the key, against kv_engine's StoredValue (about 56 bytes plus the key: the
  baseline, a published figure - kv_engine does not run here), as the ratio; mem_used; and the
  server's RSS, idle and loaded, per item. The engine's metadata figure is its estimate
  (HT_ITEM_OVERHEAD per entry, engine/memory.py); RSS growth per item is the measured one.
  10M items need about 10x the 1M run's RSS (12-13 GB today) and about an hour of loading on a
  2-core machine: `--items 10000000` where the memory is free.

* quota: `--docs` unique documents (1M) of `--value-size` bytes (4096) SET into a bucket with
  `--memory-quota` (1g), windows of 64, ETMPFAIL retried after a short pause as the SDKs do. The
  server's RSS (Linux /proc VmRSS) is sampled every second: its largest value against the quota,
  and the bucket's mem_used, values ejected, ETMPFAIL replies and items persisted at the end.
* stalled: a DCP consumer opens streams on every vbucket with a 1 MiB flow-control window (and
  cursor dropping supported) and never reads or acknowledges, while a writer overwrites `--keys`
  (10k) keys x 4 KB in `--storms` (3) storms of `--seconds` (15) with a pause between them;
  the server's RSS before, after each storm and after a last idle pause - then the same without
  the consumer. Without checkpoint memory bounds the consumer's cursors pinned every checkpoint
  and RSS climbed storm after storm; with them the two curves should stay alike.

* full: `--full-items` (1M; the target is 10M) documents of the density shape SET into a bucket
  with full eviction (`--eviction-policy fullEviction`) and a `--full-quota` (512m) quota, then a
  clean restart on the same data: warm-up time (process start to ready: full eviction loads counts
  and key filters, not documents) against 60 s; then every document read back from that server
  (all of them start on disk) and checked. The server's largest RSS over the load and the
  read-back against quota + 200 MB (the target, as the ratio). `--full-crash` ends the last
  server with SIGKILL and times the warm-up after it (no stats saved: the rows are walked).

    .venv/bin/python bench/kv_memory.py                     # all four cases
    .venv/bin/python bench/kv_memory.py --case density --items 100000,1000000
    .venv/bin/python bench/kv_memory.py --case quota --docs 300000
    .venv/bin/python bench/kv_memory.py --case full --full-items 10000000
    .venv/bin/python bench/kv_memory.py --smoke             # seconds: 3,000 documents, 8 MiB, 1 s storms
"""

import argparse
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from dcpflow.protocol import dcp
from dcpflow.protocol.frame import FrameDecoder, request
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from kv import Client, random_value
from serverproc import next_frame, start_server, stop

MiB = 1 << 20


def _status(pid: int, field: str) -> int:
    """A size field of a process's /proc status, in bytes (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss(pid: int) -> int:
    """Resident bytes of a process."""
    return _status(pid, "VmRSS:")


def rss_anon(pid: int) -> int:
    """Anonymous resident bytes of a process (RssAnon): its RSS without the store's file pages that
    SQLite's readers map (mmap_size), which the kernel can drop at will and which varied by
    hundreds of MiB between identical 1M runs."""
    return _status(pid, "RssAnon:")


def set_all(client: Client, keys: list[bytes], value: bytes, vbuckets: int, window: int = 64,
            stop_at: float | None = None) -> tuple[int, int]:
    """SET every key (windows of `window`, ETMPFAIL retried after 10 ms); returns (SETs acknowledged,
    ETMPFAIL replies). With `stop_at`, stops at that monotonic time."""
    sock, decoder = client.sock, client.decoder
    done = refused = 0
    for start in range(0, len(keys), window):
        pending = keys[start:start + window]
        while pending:
            sock.sendall(b"".join(request(Opcode.SET, key=k, extras=bytes(8), value=value,
                                          vbucket=vbucket_for_key(k, vbuckets), opaque=i)
                                  for i, k in enumerate(pending)))
            again = []
            for _ in pending:
                frame = next_frame(sock, decoder)
                if frame.status == Status.ETMPFAIL:
                    again.append(pending[frame.opaque])
                elif frame.status != Status.SUCCESS:
                    raise RuntimeError(f"SET failed with status 0x{frame.status:x}")
            done += len(pending) - len(again)
            refused += len(again)
            if again:
                time.sleep(0.01)
            pending = again
        if stop_at is not None and time.monotonic() >= stop_at:
            break
    return done, refused


def load_docs(client: Client, docs: int, value: bytes, vbuckets: int, step: int = 20_000,
              progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
    """SET `docs` unique documents (doc-000000000, ...) with `set_all`, `step` keys at a time;
    `progress(SETs acknowledged, ETMPFAIL replies)` after every tenth step. Returns the two counts."""
    done = refused = 0
    for lo in range(0, docs, step):
        d, r = set_all(client, [b"doc-%09d" % i for i in range(lo, min(lo + step, docs))], value, vbuckets)
        done, refused = done + d, refused + r
        if progress is not None and (lo // step) % 10 == 9:
            progress(done, refused)
    return done, refused


class RssSampler:
    """The largest RSS of a process, sampled every `interval` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 1.0):
        self.pid, self.interval, self.largest = pid, interval, 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.largest = max(self.largest, rss(self.pid))
            self._stopping.wait(self.interval)

    def stop(self) -> int:
        self._stopping.set()
        self._thread.join()
        self.largest = max(self.largest, rss(self.pid))
        return self.largest


def quota(args) -> None:
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        proc, port = start_server(tmp, args.vbuckets, "--allow-plain-over-tcp", "--memory-quota", args.memory_quota)
        try:
            client = Client.logged_in(port)
            idle = rss(proc.pid)
            sampler = RssSampler(proc.pid)
            value = random_value(args.value_size)
            t0 = time.monotonic()
            done, refused = load_docs(client, args.docs, value, args.vbuckets, progress=lambda done, _: print(
                f"  {done:,} SET, RSS {rss(proc.pid) / MiB:,.0f} MiB", flush=True) if args.progress else None)
            took = time.monotonic() - t0
            largest = sampler.stop()
            stats = client.stats()
            q = int(stats[b"ep_max_size"])
            print(f"quota: {args.docs:,} documents x {args.value_size} bytes "
                  f"({args.docs * args.value_size / MiB:,.0f} MiB of values) into a {q / MiB:,.0f} MiB quota "
                  f"in {took:.0f} s ({done / took:,.0f} SETs/s)")
            print(f"  server RSS: idle {idle / MiB:,.0f} MiB, largest {largest / MiB:,.0f} MiB "
                  f"(quota {(largest - q) / MiB:+,.0f} MiB), at the end {rss(proc.pid) / MiB:,.0f} MiB")
            print(f"  mem_used {int(stats[b'mem_used']) / MiB:,.0f} MiB, values ejected "
                  f"{int(stats[b'ep_num_value_ejects']):,}, ETMPFAIL replies {refused:,} (retried), "
                  f"items persisted {int(stats[b'ep_total_persisted']):,}")
        finally:
            stop(proc)


#: kv_engine's StoredValue: about 56 bytes of metadata per item plus the key (issue 46).
KV_ENGINE_META_BYTES = 56
DENSITY_KEY = b"doc-%011d"  # 15 bytes


def density_value(size: int) -> bytes:
    """A JSON object of exactly `size` bytes (at least 12)."""
    head = b'{"pad":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def density(args) -> None:
    value = density_value(args.density_value_size)
    key_len = len(DENSITY_KEY % 0)
    for n in args.items:
        with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
            proc, port = start_server(tmp, args.vbuckets, "--allow-plain-over-tcp",
                                      "--memory-quota", args.density_quota)
            try:
                client = Client.logged_in(port)
                idle, idle_anon = rss(proc.pid), rss_anon(proc.pid)
                t0 = time.monotonic()
                step = 20_000
                for lo in range(0, n, step):
                    set_all(client, [DENSITY_KEY % i for i in range(lo, min(lo + step, n))], value, args.vbuckets)
                took = time.monotonic() - t0
                client.settle(600)
                stats = client.stats()
                loaded, loaded_anon = rss(proc.pid), rss_anon(proc.pid)
                meta, used = int(stats[b"ep_meta_data_memory"]), int(stats[b"mem_used"])
                ckpt, ejected = int(stats[b"ep_checkpoint_memory"]), int(stats[b"ep_num_value_ejects"])
                beyond = meta / n - key_len
                grown = (loaded - idle) / n
                print(f"density: {n:,} items ({key_len}-byte keys, {len(value)}-byte JSON values, {args.vbuckets} "
                      f"vbuckets) loaded in {took:.0f} s ({n / took:,.0f} SETs/s), {ejected:,} values ejected")
                print(f"  metadata (ep_meta_data_memory) {meta / n:,.0f} bytes/item: {beyond:,.0f} beyond the key, "
                      f"{beyond / KV_ENGINE_META_BYTES:.1f}x kv_engine's ~{KV_ENGINE_META_BYTES}")
                print(f"  mem_used {used / MiB:,.0f} MiB ({used / n:,.0f} bytes/item for {key_len + len(value)} bytes "
                      f"of key and value; checkpoints {ckpt / MiB:,.1f} MiB)")
                print(f"  server RSS idle {idle / MiB:,.0f} MiB, loaded {loaded / MiB:,.0f} MiB: {grown:,.0f} "
                      f"bytes/item, {grown - key_len - len(value):,.0f} beyond key and value "
                      f"({(grown - key_len - len(value)) / KV_ENGINE_META_BYTES:.1f}x kv_engine's ~"
                      f"{KV_ENGINE_META_BYTES}); RSS / mem_used {loaded / used:.2f}")
                grown_anon = (loaded_anon - idle_anon) / n
                print(f"  server anonymous RSS (without the store's mapped file) idle {idle_anon / MiB:,.0f} MiB, "
                      f"loaded {loaded_anon / MiB:,.0f} MiB: {grown_anon:,.0f} bytes/item, "
                      f"{grown_anon - key_len - len(value):,.0f} beyond key and value; "
                      f"anonymous RSS / mem_used {loaded_anon / used:.2f}")
            finally:
                stop(proc)


def get_all(client: Client, keys: list[bytes], vbuckets: int, window: int = 64) -> dict[bytes, bytes | None]:
    """GET every key (windows of `window`): {key: value, None if not found}."""
    sock, decoder = client.sock, client.decoder
    out: dict[bytes, bytes | None] = {}
    for start in range(0, len(keys), window):
        pending = keys[start:start + window]
        sock.sendall(b"".join(request(Opcode.GET, key=k, vbucket=vbucket_for_key(k, vbuckets), opaque=i)
                              for i, k in enumerate(pending)))
        for _ in pending:
            frame = next_frame(sock, decoder)
            if frame.status == Status.SUCCESS:
                out[pending[frame.opaque]] = bytes(frame.value)
            elif frame.status == Status.KEY_ENOENT:
                out[pending[frame.opaque]] = None
            else:
                raise RuntimeError(f"GET failed with status 0x{frame.status:x}")
    return out


#: The RSS full eviction may take beyond the quota (issue 46), and its warm-up time, for 10M documents.
FULL_RSS_SLACK = 200 * 10**6
FULL_WARMUP_SECONDS = 60.0


def full(args) -> None:
    value = density_value(args.density_value_size)
    n = args.full_items
    step = 20_000
    with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
        opts = ("--allow-plain-over-tcp", "--memory-quota", args.full_quota, "--eviction-policy", "fullEviction")
        proc, port = start_server(tmp, args.vbuckets, *opts)
        try:
            client = Client.logged_in(port)
            idle = rss(proc.pid)
            sampler = RssSampler(proc.pid)
            t0 = time.monotonic()
            done = refused = 0
            mark = (0, t0)
            for lo in range(0, n, step):
                d, r = set_all(client, [DENSITY_KEY % i for i in range(lo, min(lo + step, n))], value, args.vbuckets)
                done, refused = done + d, refused + r
                if args.progress and (lo // step) % 5 == 4:
                    mark = _full_progress(client, proc.pid, "SET", done, t0, mark, f", {refused:,} ETMPFAIL")
            took = time.monotonic() - t0
            client.settle(3600)
            stats = client.stats()
            largest_load = sampler.stop()
            q = int(stats[b"ep_max_size"])
            print(f"full: {n:,} documents ({len(DENSITY_KEY % 0)}-byte keys, {len(value)}-byte JSON values, "
                  f"{args.vbuckets} vbuckets) into a {q / MiB:,.0f} MiB quota with full eviction in {took:.0f} s "
                  f"({done / took:,.0f} SETs/s, {refused:,} ETMPFAIL retried)")
            resident = int(stats[b"vb_active_perc_mem_resident"])
            print(f"  curr_items {int(stats[b'curr_items']):,}, resident {resident}%, "
                  f"mem_used {int(stats[b'mem_used']) / MiB:,.0f} MiB, metadata "
                  f"{int(stats[b'ep_meta_data_memory']) / MiB:,.0f} MiB, key filters "
                  f"{int(stats[b'ep_bfilter_memory']) / MiB:,.1f} MiB; server RSS idle {idle / MiB:,.0f} MiB, "
                  f"largest during the load {largest_load / MiB:,.0f} MiB, now {rss(proc.pid) / MiB:,.0f} MiB")
        finally:
            stop(proc, timeout=1800)
        # A clean restart on the same data (warm-up loads counts and key filters, no document), then
        # every document read back from that server: all of them start on disk.
        proc, client, warm = _warm_start(tmp, args.vbuckets, opts)
        try:
            stats = client.stats()
            print(f"  warm-up of a clean restart (start to ready, same data): {warm:.1f} s, "
                  f"{warm / FULL_WARMUP_SECONDS:.2f}x the {FULL_WARMUP_SECONDS:.0f} s target; curr_items "
                  f"{int(stats[b'curr_items']):,}, RSS {rss(proc.pid) / MiB:,.0f} MiB, "
                  f"mem_used {int(stats[b'mem_used']) / MiB:,.0f} MiB")
            sampler = RssSampler(proc.pid)
            t1 = time.monotonic()
            bad = 0
            mark = (0, t1)
            for lo in range(0, n, step):
                keys = [DENSITY_KEY % i for i in range(lo, min(lo + step, n))]
                bad += sum(1 for v in get_all(client, keys, args.vbuckets).values() if v != value)
                if args.progress and (lo // step) % 50 == 49:
                    mark = _full_progress(client, proc.pid, "GET", lo + len(keys), t1, mark, f", {bad:,} wrong")
            read_took = time.monotonic() - t1
            largest_read = sampler.stop()
            stats = client.stats()
            print(f"  read back {n:,} in {read_took:.0f} s ({n / read_took:,.0f} GETs/s): {n - bad:,} right, "
                  f"{bad:,} wrong or missing; ep_bg_fetched {int(stats[b'ep_bg_fetched']):,}, resident "
                  f"{int(stats[b'vb_active_perc_mem_resident'])}%, mem_used {int(stats[b'mem_used']) / MiB:,.0f} MiB")
            largest = max(largest_load, largest_read)
            print(f"  server RSS: largest during the read-back {largest_read / MiB:,.0f} MiB; largest of both "
                  f"{largest / MiB:,.0f} MiB = quota {(largest - q) / 1e6:+,.0f} MB; against quota + 200 MB: "
                  f"{largest / (q + FULL_RSS_SLACK):.2f}x")
        finally:
            if args.full_crash:
                proc.kill()
                proc.wait()
            else:
                stop(proc, timeout=1800)
        if not args.full_crash:
            return
        proc, client, warm = _warm_start(tmp, args.vbuckets, opts)
        try:
            stats = client.stats()
            sample = [DENSITY_KEY % i for i in range(0, n, max(1, n // 1000))]
            got = get_all(client, sample, args.vbuckets)
            print(f"  warm-up after kill -9 (no stats saved: the rows are walked): {warm:.1f} s, "
                  f"{warm / FULL_WARMUP_SECONDS:.2f}x the {FULL_WARMUP_SECONDS:.0f} s target; curr_items "
                  f"{int(stats[b'curr_items']):,}, RSS {rss(proc.pid) / MiB:,.0f} MiB; "
                  f"{sum(v == value for v in got.values()):,} of {len(sample):,} sampled documents read back")
        finally:
            stop(proc, timeout=1800)


def _warm_start(data_dir: str, vbuckets: int, opts: tuple) -> tuple:
    """A server started on existing data: (process, logged-in client, seconds from start to ready)."""
    t0 = time.monotonic()
    proc, port = start_server(data_dir, vbuckets, *opts)
    warm = time.monotonic() - t0
    try:
        return proc, Client.logged_in(port), warm
    except BaseException:
        stop(proc)
        raise


def _full_progress(client: Client, pid: int, what: str, done: int, t0: float, mark: tuple[int, float],
                   extra: str) -> tuple[int, float]:
    """A progress line of the full case (--progress): count, recent rate, RSS, mem_used, resident."""
    st = client.stats()
    now = time.monotonic()
    print(f"  {done:,} {what} at {now - t0:,.0f} s ({(done - mark[0]) / max(now - mark[1], 1e-9):,.0f}/s lately)"
          f"{extra}, RSS {rss(pid) / MiB:,.0f} MiB, mem_used {int(st[b'mem_used']) / MiB:,.0f} MiB, resident "
          f"{int(st[b'vb_active_perc_mem_resident'])}%", flush=True)
    return done, now


def stalled_consumer(port: int, vbuckets: int) -> socket.socket:
    """A DCP connection with streams on every vbucket and a 1 MiB window that never reads a byte."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    decoder = FrameDecoder()

    def call(data: bytes) -> None:
        sock.sendall(data)
        frame = None
        while frame is None:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the DCP connection")
            decoder.feed(chunk)
            frame = decoder.next_frame()
        if frame.status != Status.SUCCESS:
            raise RuntimeError(f"DCP setup failed with status 0x{frame.status:x}")

    call(request(Opcode.SASL_AUTH, key=b"PLAIN", value=b"\0Administrator\0password"))
    call(request(Opcode.SELECT_BUCKET, key=b"default"))
    call(request(Opcode.DCP_OPEN, key=b"bench-stalled", extras=struct.pack(">II", 0, dcp.OpenFlag.PRODUCER)))
    call(dcp.DcpControl(b"connection_buffer_size", str(MiB).encode()).encode())
    call(dcp.DcpControl(b"supports_cursor_dropping_vulcan", b"true").encode())
    # the stream requests go out together; their replies and the first megabyte of mutations stay unread
    sock.sendall(b"".join(dcp.DcpStreamRequest(vb, 0, opaque=vb).encode() for vb in range(vbuckets)))
    return sock


def stalled(args) -> None:
    for with_consumer in (True, False):
        with tempfile.TemporaryDirectory(prefix="dcpflow-bench-") as tmp:
            proc, port = start_server(tmp, args.vbuckets, "--allow-plain-over-tcp", "--memory-quota", args.storm_quota)
            try:
                writer = Client.logged_in(port)
                keys = [b"storm-%06d" % i for i in range(args.keys)]
                value = random_value(4096)
                set_all(writer, keys, value, args.vbuckets)
                writer.settle(600)
                consumer = stalled_consumer(port, args.vbuckets) if with_consumer else None
                curve = [rss(proc.pid)]
                sets = refused = 0
                for _ in range(args.storms):
                    stop_at = time.monotonic() + args.seconds
                    while time.monotonic() < stop_at:
                        d, r = set_all(writer, keys, random_value(4096), args.vbuckets, stop_at=stop_at)
                        sets, refused = sets + d, refused + r
                    curve.append(rss(proc.pid))
                    time.sleep(args.pause)
                writer.settle(600)
                time.sleep(args.pause)
                curve.append(rss(proc.pid))
                stats = writer.stats()
                who = "with a stalled consumer" if with_consumer else "without a consumer"
                print(f"stalled: {who}: {args.keys:,} keys x 4 KB, {args.storms} storms of {args.seconds:.0f} s, "
                      f"{sets:,} SETs ({refused:,} ETMPFAIL, retried)")
                print(f"  server RSS MiB: before {curve[0] / MiB:,.0f}, after each storm "
                      f"{', '.join(f'{c / MiB:,.0f}' for c in curve[1:-1])}, idle {curve[-1] / MiB:,.0f}; "
                      f"checkpoint memory {int(stats[b'ep_checkpoint_memory']) / MiB:,.1f} of "
                      f"{int(stats[b'ep_checkpoint_memory_quota']) / MiB:,.1f} MiB, cursors dropped "
                      f"{int(stats[b'ep_cursors_dropped']):,}")
                if consumer is not None:
                    consumer.close()
            finally:
                stop(proc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=("density", "quota", "stalled", "full", "all"), default="all")
    p.add_argument("--full-items", type=int, default=1_000_000, help="full: documents (default 1000000; the "
                                                                     "target is 10000000)")
    p.add_argument("--full-quota", default="512m", help="full: the bucket's quota (default 512m)")
    p.add_argument("--full-crash", action="store_true", help="full: end the read-back's server with SIGKILL and "
                   "time the warm-up after it (the rows walked)")
    p.add_argument("--items", type=lambda t: [int(x) for x in t.split(",")], default=[100_000, 1_000_000],
                   help="density: comma-separated item counts (default 100000,1000000)")
    p.add_argument("--density-value-size", type=int, default=310, help="density: JSON value bytes (default 310)")
    p.add_argument("--density-quota", default="8g", help="density: the bucket's quota, one that evicts nothing "
                                                         "(default 8g)")
    p.add_argument("--docs", type=int, default=1_000_000, help="quota: unique documents (default 1000000)")
    p.add_argument("--value-size", type=int, default=4096, help="quota: value bytes (default 4096)")
    p.add_argument("--memory-quota", default="1g", help="quota: the bucket's quota (default 1g)")
    p.add_argument("--keys", type=int, default=10_000, help="stalled: keys overwritten (default 10000)")
    p.add_argument("--storms", type=int, default=3, help="stalled: storms (default 3)")
    p.add_argument("--seconds", type=float, default=15.0, help="stalled: length of a storm (default 15)")
    p.add_argument("--pause", type=float, default=5.0, help="stalled: seconds idle after each storm (default 5)")
    p.add_argument("--storm-quota", default="100m", help="stalled: the bucket's quota (default 100m, the server's)")
    p.add_argument("--vbuckets", type=int, default=1024)
    p.add_argument("--progress", action="store_true", help="quota: print RSS every 200k documents; full: rate, "
                   "RSS, mem_used and resident ratio every 100k")
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run that checks the bench works: 3,000 documents into 8 MiB, 300 keys, "
                        "2 storms of 1 s")
    args = p.parse_args()
    if args.smoke:
        args.docs, args.memory_quota, args.keys, args.storms, args.seconds, args.pause = 3_000, "8m", 300, 2, 1.0, 0.2
        args.vbuckets, args.items, args.full_items, args.full_quota = 64, [3_000], 20_000, "4m"
    if args.case in ("density", "all"):
        density(args)
    if args.case in ("quota", "all"):
        quota(args)
    if args.case in ("stalled", "all"):
        stalled(args)
    if args.case in ("full", "all"):
        full(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
