"""`dcpflow fault`: each kind reaches its /faults endpoint on a running server and prints the JSON
answer (exit 0); the server's refusals and an unreachable or wrong URL print the reason on
stderr (exit 1); a drop without a target is a usage error (exit 2)."""

import json

import pytest

from dcpflow.cli import main
from tests.server.conftest import make_server, server  # noqa: F401  (fixtures)


def fault(server, capsys, *argv, password="password"):  # noqa: F811
    code = main(["fault", *argv, "--url", f"127.0.0.1:{server.server.mgmt.port}", "-u", "Administrator",
                 "-p", password])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_every_kind_reaches_its_endpoint(server, capsys):  # noqa: F811
    with server.login() as w:
        for i in range(20):
            w.set(b"k%d" % i, b"v")
    code, answer, _ = fault(server, capsys, "delay", "--opcode", "GET", "--seconds", "5")
    assert code == 0 and (answer["opcode"], answer["seconds"], answer["remaining_seconds"]) == ("GET", 5.0, None)
    code, answer, _ = fault(server, capsys, "pause-persistence")
    assert code == 0 and answer["paused"] is True
    code, answer, _ = fault(server, capsys, "list")
    assert [d["opcode"] for d in answer["delays"]] == ["GET"]
    assert [p["bucket"] for p in answer["persistence_paused"]] == ["default"]
    code, answer, _ = fault(server, capsys, "clear-delays", "--opcode", "GET")
    assert code == 0 and answer == {"delays_cleared": ["GET"]}
    code, answer, _ = fault(server, capsys, "resume-persistence", "--bucket", "default")
    assert code == 0 and answer["paused"] is False
    code, answer, _ = fault(server, capsys, "failover", "--vbuckets", "0-63", "--unclean")
    assert code == 0 and answer["unclean"] is True and len(answer["vbuckets"]) == 64
    vb, high = next((v["vbucket"], v["seqno"]) for v in answer["vbuckets"] if v["seqno"] > 0)
    code, answer, _ = fault(server, capsys, "rollback", "--vbucket", str(vb), "--seqno", str(high - 1))
    assert code == 0 and answer["reached"] <= high - 1 and answer["lost"] >= 1
    code, answer, _ = fault(server, capsys, "end-streams", "--reason", "state_changed", "--vbuckets", "1,2")
    assert code == 0 and answer == {"bucket": "default", "reason": "STATE_CHANGED", "streams": []}
    with server.login():
        code, answer, _ = fault(server, capsys, "drop-connections", "--bucket", "default")
        assert code == 0 and answer["dropped"] == 1
    code, answer, _ = fault(server, capsys, "delay", "--seconds", "1", "--duration", "60")
    assert code == 0 and answer["opcode"] == "all"
    code, answer, _ = fault(server, capsys, "clear")
    assert code == 0 and answer == {"persistence_resumed": [], "delays_cleared": ["all"]}
    kinds = [r["fault"] for r in fault(server, capsys, "list")[1]["recent"]]
    assert kinds == ["delay", "pause-persistence", "clear-delays", "resume-persistence", "failover", "rollback",
                     "end-streams", "drop-connections", "delay", "clear"]


@pytest.mark.parametrize("argv, words", [
    (["rollback", "--vbucket", "3", "--seqno", "5"], "seqno: vbucket 3's high seqno is 0"),
    (["end-streams", "--reason", "OK"], "reason: OK is not something"),
    (["failover", "--vbuckets", "99"], "vbuckets:"),
    (["failover", "--vbuckets", "1", "--bucket", "nope"], "404: Requested resource not found."),
    (["failover-node"], "not a node of a dcpflow cluster"),
    (["delay", "--seconds", "600"], "seconds must be a number of seconds above 0 and at most 60"),
    (["clear-delays", "--opcode", "GET"], "404: opcode: no delay rule for GET"),
])
def test_refusals_print_the_servers_reason(server, capsys, argv, words):  # noqa: F811
    code, _, err = fault(server, capsys, *argv)
    assert code == 1 and words in err, err


def test_wrong_credentials_urls_and_usage(server, capsys):  # noqa: F811
    code, _, err = fault(server, capsys, "list", password="wrong")
    assert code == 1 and "401" in err
    assert main(["fault", "list", "--url", "127.0.0.1:1"]) == 1
    assert "cannot reach http://127.0.0.1:1" in capsys.readouterr().err
    assert main(["fault", "list", "--url", "ftp://127.0.0.1:21"]) == 1
    assert "not an http(s) URL" in capsys.readouterr().err
    for argv in (["drop-connections"], ["drop-connections", "--all", "--bucket", "default"]):
        assert main(["fault", *argv, "--url", f"127.0.0.1:{server.server.mgmt.port}"]) == 2
    with pytest.raises(SystemExit) as e:
        main(["fault", "rollback", "--vbucket", "x", "--seqno", "1"])
    assert e.value.code == 2
