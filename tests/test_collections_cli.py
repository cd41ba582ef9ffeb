"""`dcpflow collections list|create|drop` against a running server's management port: what it
prints, the manifest the server then has, and a refusal's message and exit code."""

import json

from dcpflow.cli import main
from dcpflow.collections_cli import split_target
from tests.server.conftest import make_server, server  # noqa: F401  (fixtures)
from tests.server.mgmt.rest_client import http_of


def run(server, capsys, *argv, password="password"):  # noqa: F811
    code = main(["collections", *argv, "--url", f"127.0.0.1:{server.server.mgmt.port}", "-u", "Administrator",
                 "-p", password])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_create_list_and_drop(server, capsys):  # noqa: F811
    assert run(server, capsys, "create", "app") == (0, "create app: manifest uid 1\n", "")
    code, out, _ = run(server, capsys, "create", "app.orders", "--max-ttl", "60")
    assert (code, out) == (0, "create app.orders: manifest uid 2\n")
    code, _, err = run(server, capsys, "create", "app.events", "--history")  # couchstore keeps no history
    assert code == 1 and err == "dcpflow collections create: 400: Not allowed on this type of bucket\n"
    assert http_of(server).post("/pools/default/buckets/default", {"storageBackend": "magma"}).status == 200
    assert run(server, capsys, "create", "app.events", "--history")[0] == 0
    code, out, _ = run(server, capsys, "list")
    assert code == 0 and out.splitlines() == [
        "manifest uid 3", "_default (scope id 0x0)", "  _default._default (collection id 0x0)",
        "app (scope id 0x8)", "  app.orders (collection id 0x8, maxTTL 60 s)",
        "  app.events (collection id 0x9, history)"]
    engine = server.server.buckets["default"].engine
    assert server.call(lambda: engine.manifest.collection("app", "events").history)
    code, out, _ = run(server, capsys, "list", "--json")
    assert json.loads(out)["uid"] == "3"
    assert run(server, capsys, "drop", "app.orders")[:2] == (0, "drop app.orders: manifest uid 4\n")
    assert run(server, capsys, "drop", "app")[0] == 0
    assert server.call(lambda: [s.name for s in engine.manifest.scopes]) == ["_default"]


def test_refusals(server, capsys):  # noqa: F811
    code, _, err = run(server, capsys, "drop", "nowhere")
    assert code == 1 and err == "dcpflow collections drop: 404: Scope with name 'nowhere' is not found\n"
    code, _, err = run(server, capsys, "create", "_default")
    assert code == 1 and "already exists" in err
    assert run(server, capsys, "create", "a.b.c")[0] == 2
    assert run(server, capsys, "create", "app", "--history")[0] == 2
    code, _, err = run(server, capsys, "list", password="wrong")
    assert code == 1 and "401" in err
    assert split_target("s.c") == ("s", "c") and split_target("s") == ("s", None)
