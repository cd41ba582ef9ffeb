"""A realistic, reproducible workload written through the official Couchbase SDK: what `dcpflow
load` writes (load.py), and what the demo and the Spark sources make their data of.

Four kinds of JSON documents (users, products, orders, sessions), each key `kind::id`; then
churn: updates of existing documents, deletions, and short-lived sessions written with an expiry
so the server turns them into expirations. Everything follows from `seed`, so a run can be
repeated and checked. Writes go through the official SDK (`couchbase` package) on purpose: the
pipeline is then fed exactly as a production application would feed it.

Values are serialised here (compact JSON, bytes) and written with the SDK's raw-JSON transcoder,
so what the server stores - and what `verify` compares with - is byte for byte what we made.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

KINDS = ("user", "product", "order", "session")
_WEIGHTS = (0.35, 0.15, 0.40, 0.10)
_FIRST = ("Ada", "Grace", "Linus", "Margaret", "Ken", "Barbara", "Dennis", "Frances", "Alan", "Radia", "Edsger",
          "Sophie", "Tim", "Anita", "Guido", "Hedy", "John", "Katherine", "Niklaus", "Shafi")
_LAST = ("Lovelace", "Hopper", "Torvalds", "Hamilton", "Thompson", "Liskov", "Ritchie", "Allen", "Turing",
         "Perlman", "Dijkstra", "Wilson", "Berners-Lee", "Borg", "van Rossum", "Lamarr", "Backus", "Johnson")
_CITIES = (("Berlin", "DE"), ("Lyon", "FR"), ("Austin", "US"), ("Osaka", "JP"), ("Porto", "PT"), ("Leeds", "GB"),
           ("Pune", "IN"), ("Recife", "BR"), ("Tartu", "EE"), ("Bergen", "NO"))
_WORDS = ("quantum", "cedar", "amber", "linen", "granite", "harbor", "velvet", "copper", "meadow", "nimbus",
          "orbit", "prairie", "quartz", "saffron", "tundra", "willow", "zephyr", "basalt", "coral", "delta")
_STATUSES = ("pending", "paid", "packed", "shipped", "delivered", "returned")


def kind_of(index: int, seed: int) -> str:
    return random.Random(seed * 1_000_003 + index).choices(KINDS, _WEIGHTS)[0]


def key_for(index: int, seed: int) -> str:
    return f"{kind_of(index, seed)}::{index:08d}"


def make_doc(key: str, version: int, seed: int) -> bytes:
    """The JSON document for `key` at `version` (0 = as first loaded), compact UTF-8."""
    kind, _, ident = key.partition("::")
    n = int(ident)
    rng = random.Random(hash((seed, n, version)) & 0xFFFFFFFF)
    ts = 1_767_225_600 + n * 7 + version * 3600  # 2026-01-01 onwards
    if kind == "user":
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        city, country = rng.choice(_CITIES)
        doc = {"type": "user", "id": n, "name": f"{first} {last}",
               "email": f"{first.lower()}.{last.lower().replace(' ', '')}{n}@example.com",
               "address": {"street": f"{rng.randint(1, 250)} {rng.choice(_WORDS).title()} Street", "city": city,
                           "country": country, "zip": f"{rng.randint(10000, 99999)}"},
               "created_at": ts, "version": version, "loyalty_points": rng.randint(0, 50_000),
               "tags": rng.sample(_WORDS, rng.randint(1, 4)),
               "prefs": {"newsletter": rng.random() < 0.4, "language": rng.choice(("en", "de", "fr", "ja", "pt"))}}
    elif kind == "product":
        doc = {"type": "product", "sku": f"SKU-{n:08d}", "title": " ".join(rng.sample(_WORDS, 3)).title(),
               "description": " ".join(rng.choices(_WORDS, k=rng.randint(20, 60))),
               "price": round(rng.uniform(1, 500), 2), "currency": "EUR", "stock": rng.randint(0, 1000),
               "categories": rng.sample(_WORDS, rng.randint(1, 3)), "version": version, "updated_at": ts}
    elif kind == "order":
        items = [{"sku": f"SKU-{rng.randint(0, 99_999):08d}", "qty": rng.randint(1, 5),
                  "price": round(rng.uniform(1, 200), 2)} for _ in range(rng.randint(1, 6))]
        doc = {"type": "order", "id": n, "user_id": rng.randint(0, 99_999), "items": items,
               "total": round(sum(i["qty"] * i["price"] for i in items), 2), "status": _STATUSES[min(version, 5)],
               "created_at": ts, "version": version}
    else:
        doc = {"type": "session", "id": n, "user_id": rng.randint(0, 99_999), "started_at": ts,
               "ip": f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
               "user_agent": rng.choice(("Mozilla/5.0 (X11; Linux x86_64)", "Mozilla/5.0 (Macintosh)", "curl/8.5")),
               "pages": rng.randint(1, 40), "version": version}
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass
class Workload:
    """What to write: `docs` initial documents, then `updates`, `deletes` and `expiring`
    (new session documents with `ttl` seconds to live) in `rounds` rounds."""

    docs: int = 100_000
    updates: int = 10_000
    deletes: int = 2_000
    expiring: int = 1_000
    ttl: int = 2
    rounds: int = 5
    seed: int = 42
    versions: dict = field(default_factory=dict)  # key -> current version, for updates

    def initial_keys(self) -> list[str]:
        return [key_for(i, self.seed) for i in range(self.docs)]


class Loader:
    """An SDK connection to one bucket that writes and reads raw JSON bytes in bulk."""

    def __init__(self, connection: str, username: str, password: str, bucket: str = "default",
                 timeout: float = 30.0, scope: str | None = None, collection: str | None = None):
        # the official SDK: the `load` extra (a ModuleNotFoundError names it, cli.py/extras.py)
        from couchbase.auth import PasswordAuthenticator
        from couchbase.cluster import Cluster
        from couchbase.options import ClusterOptions, ClusterTimeoutOptions

        timeouts = ClusterTimeoutOptions(kv_timeout=timedelta(seconds=timeout),
                                         connect_timeout=timedelta(seconds=timeout),
                                         bootstrap_timeout=timedelta(seconds=timeout))
        # The dcp source's connection strings carry the bucket as a path; the SDK takes it apart.
        base = connection.split("?", 1)[0]
        scheme, _, rest = base.partition("://")
        hosts = rest.split("/", 1)[0]
        self.cluster = Cluster(f"{scheme}://{hosts}",
                               ClusterOptions(PasswordAuthenticator(username, password), timeout_options=timeouts))
        self.bucket = self.cluster.bucket(bucket)
        if collection is None:
            self.collection = self.bucket.default_collection()
        else:  # a named collection (`scope` defaults to _default)
            self.collection = self.bucket.scope(scope or "_default").collection(collection)

    def in_collection(self, scope: str, collection: str) -> Loader:
        """This loader writing into `scope.collection`, over the same SDK connection (close the
        original, not the copy)."""
        other = copy.copy(self)
        other.collection = self.bucket.scope(scope).collection(collection)
        return other

    def close(self) -> None:
        self.cluster.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def upsert(self, docs: dict[str, bytes], ttl: int | None = None, chunk: int = 5000) -> None:
        from couchbase.options import UpsertMultiOptions
        from couchbase.transcoder import RawJSONTranscoder

        items = list(docs.items())
        for i in range(0, len(items), chunk):
            kwargs = {"transcoder": RawJSONTranscoder()}
            if ttl:
                kwargs["expiry"] = timedelta(seconds=ttl)
            result = self.collection.upsert_multi(dict(items[i:i + chunk]), UpsertMultiOptions(**kwargs))
            if not result.all_ok:
                key, exc = next(iter(result.exceptions.items()))
                raise RuntimeError(f"upsert of {key!r} failed: {exc}")

    def remove(self, keys: Iterable[str], chunk: int = 5000) -> None:
        from couchbase.exceptions import DocumentNotFoundException

        keys = list(keys)
        for i in range(0, len(keys), chunk):
            result = self.collection.remove_multi(keys[i:i + chunk])
            for key, exc in (result.exceptions or {}).items():
                if not isinstance(exc, DocumentNotFoundException):
                    raise RuntimeError(f"remove of {key!r} failed: {exc}")

    def get_all(self, keys: Iterable[str], chunk: int = 5000) -> dict[str, bytes]:
        """The current value of every key that exists (missing and expired keys are left out)."""
        from couchbase.exceptions import DocumentNotFoundException
        from couchbase.options import GetMultiOptions
        from couchbase.transcoder import RawJSONTranscoder

        keys = list(keys)
        out: dict[str, bytes] = {}
        for i in range(0, len(keys), chunk):
            result = self.collection.get_multi(keys[i:i + chunk], GetMultiOptions(transcoder=RawJSONTranscoder()))
            for key, exc in (result.exceptions or {}).items():
                if not isinstance(exc, DocumentNotFoundException):
                    raise RuntimeError(f"get of {key!r} failed: {exc}")
            for key, res in result.results.items():
                value = res.value
                out[key] = value if isinstance(value, bytes) else str(value).encode()
        return out


COLLECTION_OF = {"user": "users", "product": "products", "order": "orders", "session": "sessions"}
"""The collection of each kind of document when the workload lives in named collections."""


def create_collections(loader: Loader, scope: str, history: Iterable[str] = (), max_ttl: dict | None = None) -> None:
    """`scope` with one collection per kind (COLLECTION_OF), made by the SDK's collection manager as
    an application would: the collections named in `history` keep every version (DCP change
    streams; the bucket's history retention must be set for them to keep any), `max_ttl` maps a
    collection to its maxTTL in seconds (documents written without an expiry get it). Collections
    keep history only in a magma bucket, as in Couchbase: with `history` given, every collection is
    told whether it keeps history (a magma bucket's default is to keep it); without, none is told
    (a couchstore bucket refuses the setting, even false)."""
    from couchbase.management.collections import CreateCollectionSettings

    history, max_ttl = set(history), max_ttl or {}
    unknown = (history | set(max_ttl)) - set(COLLECTION_OF.values())
    if unknown:
        raise ValueError(f"not a collection of the workload: {sorted(unknown)}")
    manager = loader.bucket.collections()
    manager.create_scope(scope)
    for name in COLLECTION_OF.values():
        ttl = max_ttl.get(name)
        settings = CreateCollectionSettings(max_expiry=timedelta(seconds=ttl) if ttl else None,
                                            history=(name in history) if history else None)
        manager.create_collection(scope, name, settings)


class ByKind:
    """A Loader's upsert/remove/get_all with each `kind::id` key in its kind's collection of `scope`
    (COLLECTION_OF), so load_initial and churn_round fill named collections unchanged. Counts what
    it wrote and removed per collection (`written`, `removed`), which a change log with history
    must match version for version."""

    def __init__(self, loader: Loader, scope: str):
        self.scope = scope
        self.loaders = {name: loader.in_collection(scope, name) for name in COLLECTION_OF.values()}
        self.written: Counter = Counter()
        self.removed: Counter = Counter()

    @staticmethod
    def collection_of(key: str) -> str:
        return COLLECTION_OF[key.partition("::")[0]]

    def _split(self, keys: Iterable[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for key in keys:
            out.setdefault(self.collection_of(key), []).append(key)
        return out

    def upsert(self, docs: dict[str, bytes], ttl: int | None = None) -> None:
        for name, keys in self._split(docs).items():
            self.loaders[name].upsert({k: docs[k] for k in keys}, ttl=ttl)
            self.written[name] += len(keys)

    def remove(self, keys: Iterable[str]) -> None:
        for name, part in self._split(keys).items():
            self.loaders[name].remove(part)
            self.removed[name] += len(part)

    def get_all(self, keys: Iterable[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for name, part in self._split(keys).items():
            out.update(self.loaders[name].get_all(part))
        return out


def load_initial(loader: Loader, work: Workload, progress: Callable[[int, int], None] | None = None) -> list[str]:
    keys = work.initial_keys()
    step = 10_000
    for i in range(0, len(keys), step):
        part = keys[i:i + step]
        loader.upsert({k: make_doc(k, 0, work.seed) for k in part})
        for k in part:
            work.versions[k] = 0
        if progress:
            progress(min(i + step, len(keys)), len(keys))
    return keys


def churn_round(loader: Loader, work: Workload, round_no: int) -> dict[str, int]:
    """One round of updates, deletions and expiring sessions; returns what it did."""
    rng = random.Random(work.seed * 7919 + round_no)
    live = [k for k, v in work.versions.items() if v >= 0]
    n_upd = min(len(live), work.updates // work.rounds)
    n_del = min(len(live) - n_upd, work.deletes // work.rounds)
    picked = rng.sample(live, n_upd + n_del) if live else []
    updates, deletes = picked[:n_upd], picked[n_upd:]
    docs = {}
    for k in updates:
        work.versions[k] += 1
        docs[k] = make_doc(k, work.versions[k], work.seed)
    loader.upsert(docs)
    loader.remove(deletes)
    for k in deletes:
        work.versions[k] = -1
    base = work.docs + round_no * (work.expiring // work.rounds)
    expiring = {f"session::{base + i:08d}": make_doc(f"session::{base + i:08d}", 0, work.seed)
                for i in range(work.expiring // work.rounds)}
    loader.upsert(expiring, ttl=work.ttl)
    for k in expiring:
        work.versions[k] = 0
    return {"updates": len(updates), "deletes": len(deletes), "expiring": len(expiring)}


def burst_round(loader: Loader, work: Workload, round_no: int, kinds: Iterable[str] = ("user", "order"),
                keys: int = 10, versions: int = 3) -> int:
    """`keys` live documents of each of `kinds` updated `versions` times in a row (an order going
    from paid to packed to shipped): a collection with history keeps every version, one without
    may de-duplicate them. Returns the updates written."""
    rng = random.Random(work.seed * 104_729 + round_no)
    picked = []
    for kind in kinds:
        live = sorted(k for k, v in work.versions.items() if v >= 0 and k.startswith(kind + "::"))
        picked += rng.sample(live, min(keys, len(live)))
    for _ in range(versions):
        docs = {}
        for k in picked:
            work.versions[k] += 1
            docs[k] = make_doc(k, work.versions[k], work.seed)
        loader.upsert(docs)
    return len(picked) * versions
