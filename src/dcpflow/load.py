"""`dcpflow load`: the workload of dcpflow.client.workload, written to a server from the command line
(argument parsing and the run; the documents, the Loader and the rounds are in the workload module,
which the demo and the Spark sources share)."""

from .client.workload import Loader, Workload, churn_round, load_initial


def add_command(sub) -> None:
    """`dcpflow load` (argument parsing; wired in cli.py)."""
    p = sub.add_parser("load", help="write a realistic JSON workload (and optional churn) through the Couchbase SDK",
                       description="Load users, products, orders and sessions as JSON documents, then optionally "
                       "run rounds of updates, deletions and expiring sessions. Reproducible with --seed.")
    p.add_argument("--connection", required=True, help="couchbase://host:port[/bucket]")
    p.add_argument("--username", default="Administrator")
    p.add_argument("--password", default="password")
    p.add_argument("--bucket", default=None, help="bucket (default: from the connection string, else default)")
    p.add_argument("--docs", type=int, default=100_000, help="documents to load (default 100000)")
    p.add_argument("--rounds", type=int, default=0, help="rounds of churn after the load (default 0)")
    p.add_argument("--updates", type=int, default=10_000, help="updates over all rounds")
    p.add_argument("--deletes", type=int, default=2_000, help="deletions over all rounds")
    p.add_argument("--expiring", type=int, default=1_000, help="expiring session documents over all rounds")
    p.add_argument("--ttl", type=int, default=10, help="seconds to live of expiring documents")
    p.add_argument("--seed", type=int, default=42)
    p.set_defaults(func=_cmd_load, extra="load")


def _cmd_load(args) -> int:
    import sys
    import time

    if args.docs < 0 or args.rounds < 0:
        print("dcpflow load: --docs and --rounds must not be negative", file=sys.stderr)
        return 2
    bucket = args.bucket
    if bucket is None:
        path = args.connection.split("://", 1)[-1].split("?", 1)[0].partition("/")[2].strip("/")
        bucket = path or "default"
    work = Workload(docs=args.docs, updates=args.updates, deletes=args.deletes, expiring=args.expiring,
                    ttl=args.ttl, rounds=max(args.rounds, 1), seed=args.seed)
    started = time.monotonic()
    try:
        loader = Loader(args.connection, args.username, args.password, bucket)
    except ModuleNotFoundError:
        raise  # no SDK: cli.py names the extra
    except Exception as e:  # the SDK raises many types; each says what failed
        print(f"dcpflow load: cannot connect: {e}", file=sys.stderr)
        return 1
    with loader:
        load_initial(loader, work, lambda n, total: print(f"loaded {n:,}/{total:,}", flush=True))
        for i in range(args.rounds):
            did = churn_round(loader, work, i)
            print(f"round {i + 1}/{args.rounds}: {did}", flush=True)
    took = time.monotonic() - started
    print(f"done in {took:.1f}s ({args.docs / max(took, 1e-9):,.0f} docs/s)", flush=True)
    return 0
