"""`dcpflow pipeline` and `dcpflow demo` (argument parsing only; Spark is imported when they run)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time


def add_commands(sub) -> None:
    p = sub.add_parser("demo", help="the main job end to end: server → data → Spark CDC pipeline → verified lake",
                       description="Start an embedded dcpflow server on a free port, load a realistic dataset "
                       "through the Couchbase SDK, run the Spark pipeline (AvailableNow, then live micro-batches "
                       "while updates, deletes and expiries arrive), check the state table against the server "
                       "key by key and print a report. Exit status 0 only if they are equal.")
    p.add_argument("--docs", type=int, default=100_000, help="documents to load first (default 100000)")
    p.add_argument("--vbuckets", type=int, default=64, help="vbuckets of the embedded server (default 64)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of live changes (default 5)")
    p.add_argument("--state-format", choices=("delta", "snapshot"), default="delta",
                   help="state table: delta (Delta Lake's MERGE INTO, in Spark) or snapshot (Spark-native "
                   "compaction, no jars)")
    p.add_argument("--dir", help="keep everything (server data, lake) in this directory")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.set_defaults(func=_cmd_demo, extra="spark")

    p = sub.add_parser("pipeline", help="run the Spark CDC pipeline against a server into a lake directory",
                       description="Stream a bucket's changes (DCP) into <lake>/changelog (Parquet, exactly-once) "
                       "and <lake>/state (latest document per key, deletions applied). Checkpoints live in "
                       "<lake>/_checkpoints, so running it again resumes where it stopped.")
    p.add_argument("--connection", required=True, help="couchbase://host:port/bucket")
    p.add_argument("--username", default="Administrator")
    p.add_argument("--password", default="password")
    p.add_argument("--lake", required=True, help="directory for the change log, state table and checkpoints")
    p.add_argument("--state-format", choices=("delta", "snapshot"), default="delta")
    p.add_argument("--value-format", choices=("binary", "string", "json"), default="string")
    p.add_argument("--max-seqnos-per-trigger", type=int, help="admission control: seqnos per micro-batch")
    p.add_argument("--partitions", type=int, help="Spark tasks per micro-batch (default: one per core)")
    p.add_argument("--trigger", default=None, metavar="INTERVAL",
                   help="keep running with this processing-time trigger (e.g. '5 seconds'); "
                   "default: AvailableNow, i.e. catch up and stop")
    p.add_argument("--scope", metavar="NAME", help="only this scope's collections (those created later too)")
    p.add_argument("--collection", action="append", default=[], metavar="SCOPE.COLLECTION",
                   help="only this collection (repeatable); a bare name is in --scope")
    p.add_argument("--history", action="store_true",
                   help="change streams: every retained version of collections with history into the change log")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--master", metavar="URL",
                       help="run on this Spark cluster (spark://host:7077, yarn, k8s://...) instead of local mode; "
                            "executors need dcpflow in the Python PYSPARK_PYTHON names (docs/spark.md)")
    where.add_argument("--remote", metavar="URL", help="run through this Spark Connect server (sc://host:15002)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the session (repeatable), e.g. spark.executor.memory=4g")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="any other option of the dcp source (repeatable)")
    p.set_defaults(func=_cmd_pipeline, extra="spark")

    p = sub.add_parser("restore", help="rebuild a bucket from the pipeline's change log, as of a micro-batch",
                       description="Point-in-time recovery from the lake: every document as it stood after "
                       "micro-batch --as-of (default: the newest) of <lake>/changelog is written to the bucket of "
                       "--to with its metadata (SetWithMeta/DelWithMeta: CAS, rev seqno, flags, expiry; deleted "
                       "documents as tombstones), by Spark tasks in parallel.")
    p.add_argument("--lake", required=True, help="the lake directory of `dcpflow pipeline`")
    p.add_argument("--to", required=True, metavar="URL", help="connection string with the bucket to write to")
    p.add_argument("--as-of", type=int, metavar="BATCH",
                   help="the change-log batch to restore as of, as `dcpflow pipeline` prints it ('changelog batch "
                        "N'; the rows' _commit_version); default: the newest")
    p.add_argument("-u", "--username", default="Administrator")
    p.add_argument("-p", "--password", default="password")
    p.add_argument("--partitions", type=int, help="Spark tasks writing (default: one per core)")
    p.add_argument("--collection", action="append", metavar="SCOPE.COLLECTION",
                   help="restore only this collection (repeatable; default: every collection, each into the "
                   "collection of the same name in --to, which must exist)")
    p.set_defaults(func=_cmd_restore, extra="spark")


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    from .jars import JarsMissing
    from .pipeline import PipelineFailed

    if args.docs < 1 or args.vbuckets < 1 or args.rounds < 1:
        print("dcpflow demo: --docs, --vbuckets and --rounds must be positive", file=sys.stderr)
        return 2
    try:
        with stopped_by_signals():
            result = run_demo(docs=args.docs, workdir=args.dir, vbuckets=args.vbuckets,
                              state_format=args.state_format, rounds=args.rounds, keep=args.keep)
    except (PipelineFailed, JarsMissing) as e:
        print(f"dcpflow demo: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("dcpflow demo: stopped (its server, Spark and temporary directory are gone)", file=sys.stderr, flush=True)
        return 130
    return 0 if result.ok else 1


@contextlib.contextmanager
def stopped_by_signals():
    """SIGTERM as Ctrl-C: either unwinds the command through its `finally` blocks (the demo's
    embedded server and Spark stop, its temporary directory goes) instead of ending the process on
    the spot with them left behind. A second signal while that cleanup runs is ignored."""
    import signal

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _cmd_restore(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .restore import RestoreError, restore
    if not (Path(args.lake) / "changelog").is_dir():
        print(f"dcpflow restore: {args.lake} has no changelog directory (a lake of `dcpflow pipeline`)",
              file=sys.stderr)
        return 2
    from .session import local_session

    spark = local_session("dcpflow-restore")
    try:
        result = restore(spark, args.lake, args.to, args.username, args.password, args.as_of, args.partitions,
                         args.collection)
    except RestoreError as e:
        print(f"dcpflow restore: {e}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(f"restored version {result['version']}: {result['documents']} documents, {result['tombstones']} "
          f"tombstones", flush=True)
    return 0


def _cmd_pipeline(args: argparse.Namespace) -> int:
    from .options import DcpOptionError, parse_options
    from .pipeline import Pipeline, PipelineConfig

    extra = {}
    for item in args.option:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"dcpflow pipeline: --option {item!r} must be NAME=VALUE", file=sys.stderr)
            return 2
        extra[name] = value
    if args.scope:
        extra["scope"] = args.scope
    if args.collection:
        extra["collections"] = ",".join(args.collection)
    if args.history:
        extra["history"] = "true"
    config = PipelineConfig(connection=args.connection, username=args.username, password=args.password,
                            lake=args.lake, state_format=args.state_format, value_format=args.value_format,
                            max_seqnos_per_trigger=args.max_seqnos_per_trigger, partitions=args.partitions,
                            options=extra)
    try:
        parse_options(config.source_options())  # bad options: a clear message before Spark starts
    except DcpOptionError as e:
        print(f"dcpflow pipeline: {e}", file=sys.stderr)
        return 2
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"dcpflow pipeline: --conf {item!r} must be KEY=VALUE", file=sys.stderr)
            return 2
        conf[key] = value
    if conf and args.remote:
        print("dcpflow pipeline: --conf does not apply to a Spark Connect session (set it on its server)",
              file=sys.stderr)
        return 2
    from .jars import JarsMissing
    from .pipeline import PipelineFailed, failure_line
    from .session import cluster_session, local_session, stop_spark

    try:
        if args.master or args.remote:
            spark = cluster_session("dcpflow-pipeline", master=args.master, remote=args.remote, conf=conf)
        else:
            spark = local_session("dcpflow-pipeline", conf=conf)
    except Exception as e:  # no Java, a cluster or Connect server that cannot be reached...
        print(f"dcpflow pipeline: Spark did not start: {failure_line(e)}", file=sys.stderr)
        return 1
    started = time.monotonic()

    def show(r):
        lag = "" if r.lag is None else f", lag {r.lag:,} seqnos"
        took = f" in {r.seconds:.2f}s" if r.seconds else ""
        print(f"[{time.monotonic() - started:6.1f}s] {r.describe()}: {r.rows:,} rows{took}{lag}", flush=True)

    try:
        pipeline = Pipeline(spark, config)
        if args.trigger is None:
            pipeline.run_available_now(show)
            print(f"caught up: change log {pipeline.changelog_path}, state {pipeline.state_path}", flush=True)
            return 0
        print(f"running every {args.trigger}; Ctrl-C stops (the checkpoints keep the position)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            pipeline.run_live(args.trigger, show)
        return 0
    except (PipelineFailed, JarsMissing) as e:
        print(f"dcpflow pipeline: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        stop_spark(spark)

