"""`dcpflow xdcr SOURCE_URL TARGET_URL -u USER -p PASSWORD --state-dir DIR`: replicate one bucket to
another in the foreground until SIGTERM or SIGINT, which take a last checkpoint and exit 0."""

import asyncio
import logging
import signal
import sys

from .checkpoints import CheckpointError
from .conflict import DEFAULT_OPTIMISTIC_THRESHOLD
from .filters import Filters
from .replicator import ReplicationError, Settings, XdcrReplicator


async def _run(args) -> int:
    from dcpflow.client.rest_client import password_of
    password = password_of(args)
    settings = Settings(
        filters=Filters(args.filter_key, args.skip_deletions, args.skip_expirations, args.strip_ttl),
        optimistic_threshold=args.optimistic_threshold, checkpoint_interval=args.checkpoint_interval,
        batch_size=args.batch_size, conflict_resolution=args.conflict_resolution)
    settings.filters.compile()  # a bad regular expression is refused before anything connects
    replicator = XdcrReplicator(args.source, args.target, username=args.username, password=password,
                                target_username=args.target_username, target_password=args.target_password,
                                state_dir=args.state_dir, settings=settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = None
    if args.metrics_port is not None:
        from .metrics import serve
        runner = await serve(replicator, args.metrics_host, args.metrics_port)
        port = runner.addresses[0][1]
        print(f"dcpflow xdcr metrics: http://{args.metrics_host}:{port}/metrics", flush=True)
    task = asyncio.create_task(replicator.run(stop))
    ready = asyncio.create_task(replicator.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done() and not task.done():
        print(f"dcpflow xdcr ready: {replicator.source.bucket} -> {replicator.target.client.bucket} "
              f"conflict_resolution={replicator.mode.value} state_dir={args.state_dir}", flush=True)
    else:
        ready.cancel()
    try:
        await task
    finally:
        if runner is not None:
            await runner.cleanup()
    stats = replicator.stats
    print(f"dcpflow xdcr stopped: docs_written={stats['docs_written']} failed_cr_target={stats['failed_cr_target']} "
          f"failed_cr_source={stats['failed_cr_source']} checkpoints={stats['checkpoints']}", flush=True)
    return 0


def main(args) -> int:
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        try:
            import uvloop  # faster socket reads and writes, as `dcpflow server --loop auto` uses
        except ImportError:
            return asyncio.run(_run(args))
        return uvloop.run(_run(args))
    except (ReplicationError, CheckpointError, ValueError) as e:
        print(f"dcpflow xdcr: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a connection that never came up: say why in one line
        from dcpflow.client import ClientError
        if isinstance(e, ClientError):
            print(f"dcpflow xdcr: {e}", file=sys.stderr)
            return 1
        raise


def add_command(sub) -> None:
    p = sub.add_parser("xdcr", help="replicate a bucket to another cluster's bucket with its metadata (XDCR)",
                       description="Read every change of the source bucket over DCP and write it to the target "
                       "bucket with SetWithMeta/DelWithMeta (CAS, rev seqno, flags, expiry, xattrs), so that "
                       "conflict resolution converges both; run one each way for bidirectional replication. "
                       "Checkpoints in --state-dir make a restart resume where it stopped.")
    p.add_argument("source", help="source connection string with the bucket, e.g. couchbase://10.0.0.1/travel")
    p.add_argument("target", help="target connection string with the bucket")
    p.add_argument("-u", "--username", default="Administrator", help="user on the source (and the target)")
    p.add_argument("-p", "--password", help="default: $DCPFLOW_PASSWORD, else 'password'")
    p.add_argument("--target-username", help="user on the target, when it differs")
    p.add_argument("--target-password", help="password on the target, when it differs")
    p.add_argument("--state-dir", required=True, help="where checkpoints.json and status.json live")
    p.add_argument("--filter-key", metavar="REGEX", help="replicate only keys this regular expression matches")
    p.add_argument("--skip-deletions", action="store_true", help="do not replicate deletions")
    p.add_argument("--skip-expirations", action="store_true", help="do not replicate expirations")
    p.add_argument("--strip-ttl", action="store_true", help="write documents without their expiry")
    p.add_argument("--optimistic-threshold", type=int, default=DEFAULT_OPTIMISTIC_THRESHOLD, metavar="BYTES",
                   help="documents larger than this are checked with GET_META on the target before they are sent "
                   f"(default {DEFAULT_OPTIMISTIC_THRESHOLD})")
    p.add_argument("--conflict-resolution", choices=("auto", "seqno", "lww"), default="auto",
                   help="the buckets' type (default auto: asked from both clusters' REST API)")
    p.add_argument("--checkpoint-interval", type=float, default=5.0, metavar="SECONDS",
                   help="checkpoint this often (default 5)")
    p.add_argument("--batch-size", type=int, default=512, help="changes per pipelined batch (default 512)")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve the replicator's stats as Prometheus /metrics on this port (0: any free one)")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of --metrics-port (default 127.0.0.1)")
    p.add_argument("--debug", action="store_true", help="log more")
    p.set_defaults(func=main)
