"""`pip install dcpflow` without extras: the wheel is built from this tree, installed in a fresh
venv with the base dependencies only (aiohttp, cramjam), and every command is run there.

The server, `inspect`, `tail` (JSON lines and the table, from the client's event API), `cluster`,
`xdcr`, `fault` and `collections` work; `load` and the Spark commands refuse in one line that
names the extra to install, with exit 1 and no traceback. scripts/setup.sh downloads the build
requirements and the base dependencies into .venv/wheelhouse, so nothing here uses the network.
"""

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import run_group

from .server.client import RawClient

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE = ROOT / ".venv" / "wheelhouse"
DEADLINE = 300.0  # bounds a failure only: the whole build and install take well under a minute

pytestmark = pytest.mark.slow


def run(*cmd, timeout: float = DEADLINE, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = run_group([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with dcpflow's wheel and nothing else but its base dependencies."""
    if not any(WHEELHOUSE.glob("setuptools-*.whl")):
        pytest.fail(f"{WHEELHOUSE} has no wheels: run scripts/setup.sh (it downloads them)")
    work = tmp_path_factory.mktemp("plain-install")
    tree = work / "tree"  # the sources alone: the build writes nothing into the worktree
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    offline = ["--no-index", "--find-links", WHEELHOUSE]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *offline, "-w", work / "dist", tree, env=env)
    wheel = next((work / "dist").glob("dcpflow-*.whl"))
    # the venv gets no pip of its own (ensurepip is the slowest step): this pip installs into it
    run(sys.executable, "-m", "venv", "--without-pip", work / "venv", env=env)
    python = work / "venv" / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", *offline, wheel, env=env)
    return work / "venv"


def dcpflow(venv: Path, *args, stdin: str | None = None, check: bool = False, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return run(venv / "bin" / "dcpflow", *args, input=stdin, check=check, env=env, cwd=cwd)


def test_the_venv_has_no_extras(venv):
    """The premise: neither numpy, pyarrow, pyspark nor the SDK is importable there."""
    probe = "import importlib.util as u; print([m for m in ('numpy', 'pyarrow', 'pyspark', 'couchbase', " \
            "'pandas') if u.find_spec(m)])"
    assert run(venv / "bin" / "python", "-c", probe).stdout.strip() == "[]"


def test_help_of_every_command(venv):
    top = dcpflow(venv, "--help", check=True)
    commands = top.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert {"server", "inspect", "tail", "load", "pipeline"} <= set(commands)
    for command in ("tail", "server"):
        done = dcpflow(venv, command, "--help")
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr)
    # every command's help, in one process (each start of Python costs seconds on a busy machine)
    each = ("import contextlib, io, sys\nfrom dcpflow.cli import main\nfor c in sys.argv[1:]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n        try:\n            main([c, '--help'])\n"
            "        except SystemExit as e:\n            assert e.code == 0, (c, e.code)\n")
    run(venv / "bin" / "python", "-c", each, *commands)


def test_inspect(venv):
    get = "80 00 00 01 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 00 6b\n"
    done = dcpflow(venv, "inspect", stdin=get, check=True)
    frame = json.loads(done.stdout)
    assert frame["opcode_name"] == "GET" and frame["key"] == "k" and frame["problems"] == []


class Server:
    """`dcpflow server` of the venv, read until its ready line (within a deadline)."""

    def __init__(self, venv: Path, data: Path):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen([venv / "bin" / "dcpflow", "server", "--port", "0", "--mgmt-port", "0",
                                      "--vbuckets", "16", "--data-dir", data], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, text=True)
        line = ""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if sel.select(timeout=DEADLINE):
                line = self.proc.stdout.readline()
        if "dcpflow server ready" not in line:
            self.proc.kill()
            raise AssertionError(f"no ready line: {line!r} {self.proc.stderr.read()}")
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        self.port, self.mgmt_port = int(fields["port"]), int(fields["mgmt_port"])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(DEADLINE)
        finally:
            self.proc.stdout.close()
            self.proc.stderr.close()


@pytest.fixture
def server(venv, tmp_path):
    srv = Server(venv, tmp_path / "data")
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(DEADLINE)


def test_server_set_get_and_tail(venv, server, tmp_path):
    """One SET and GET over a socket, the change read back by `tail` (both formats, from the event
    API), a collection made by `collections`, and a clean stop."""
    with RawClient(server.port) as client:
        client.num_vbuckets = 16
        client.login()
        assert client.set(b"plain", b'{"installed":"without extras"}').status == 0
        got = client.get(b"plain")
        assert got.status == 0 and got.value == b'{"installed":"without extras"}'
    url = f"couchbase://127.0.0.1:{server.port}/default"
    lines = dcpflow(venv, "tail", url, "--until", "now", "--no-progress", check=True).stdout.splitlines()
    docs = [json.loads(line) for line in lines]
    assert [(d["event"], d["key"], d["value"]) for d in docs] == [("mutation", "plain",
                                                                  {"installed": "without extras"})]
    table = dcpflow(venv, "tail", url, "--until", "now", "--no-progress", "--format", "table", check=True)
    assert "plain" in table.stdout.splitlines()[1]
    mgmt = f"127.0.0.1:{server.mgmt_port}"
    dcpflow(venv, "collections", "create", "shop", "--url", mgmt, check=True)
    dcpflow(venv, "collections", "create", "shop.orders", "--url", mgmt, check=True)
    listed = dcpflow(venv, "collections", "list", "--url", mgmt, "--json", check=True)
    assert "orders" in {c["name"] for s in json.loads(listed.stdout)["scopes"] for c in s["collections"]}
    # a read filtered by collection names (the name follower, numpy's look or not)
    named = dcpflow(venv, "tail", url, "--until", "now", "--no-progress", "--collection", "shop.orders", check=True)
    assert {(d["event"], d.get("kind"), d.get("collection")) for d in map(json.loads, named.stdout.splitlines())} \
        == {("system", "collection_created", "orders")}
    assert server.stop() == 0


def test_commands_that_need_an_extra_say_which(venv, server, tmp_path):
    url = f"couchbase://127.0.0.1:{server.port}/default"
    for args, extra in [(("load", "--connection", url, "--docs", "1"), "load"),
                        (("pipeline", "--connection", url, "--lake", tmp_path / "lake"), "spark"),
                        (("restore", "--lake", tmp_path / "lake", "--to", url), "spark"),
                        (("demo", "--docs", "1"), "spark")]:
        started = time.monotonic()
        done = dcpflow(venv, *args, cwd=tmp_path)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"dcpflow {args[0]}: needs ")
        assert f"pip install 'dcpflow[{extra}]'" in done.stderr
        assert time.monotonic() - started < 60  # refused at once, not after a run
