"""Every benchmark in bench/ runs end to end in its seconds-long `--smoke` mode.

Nothing else runs the benchmarks, so without this a bench breaks unseen when the code it drives
changes (a renamed method, a new protocol class). The smoke modes use tiny sizes and one round; the
figures they print are not judged here (wall-clock figures mean nothing on a busy machine), only
that the script exits 0 and prints the line that carries its figure.
"""

import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_group

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

#: Each bench script (with the arguments of a second figure it makes) and a piece of the line that
#: carries its figure.
FIGURE_LINES = {
    "client.py": "batch API / event API",
    "codec.py": "decode to typed messages",
    "kv.py": "dcpflow    SET",
    "kv.py --durability majority": "ratio durable/plain",
    "kv_instructions.py": "SET",
    "kv_memory.py": "server RSS",
    "kv_memory.py --case density": "beyond the key",
    "kv_persist.py": "all persisted",
    "kv_pressure.py": "ratio quota/no quota",
    "producer.py": "in-memory producer",
    "producer_instructions.py": "instructions per streamed item",
    "range_scan.py": "ratio on-disk/resident",
    "replication.py": "ratio replicated/written",
    "pipeline_scale.py": "catch-up / sink limit",
    "spark_ingest.py": "dcp changelog / synthetic changelog",
    "xdcr.py": "ratio xdcr / raw SetWithMeta",
}


def bench_scripts() -> list[str]:
    """The runnable scripts of bench/ (helper modules such as serverproc.py have no main)."""
    return sorted(p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def test_every_bench_script_has_a_smoke_check():
    assert bench_scripts() == sorted({k.split()[0] for k in FIGURE_LINES}), \
        "a bench script was added or removed: update FIGURE_LINES"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(FIGURE_LINES))
def test_bench_smoke(script, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TMPDIR=str(tmp_path))  # whatever a bench leaves behind goes with the test's directory
    # A hang must fail the test, not stall CI: no smoke takes more than about a minute.
    name, *extra = script.split()
    proc = run_group([sys.executable, str(BENCH / name), *extra, "--smoke"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=600)
    report = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"bench/{script} --smoke exited {proc.returncode}\n{report}"
    assert FIGURE_LINES[script] in proc.stdout, f"bench/{script} --smoke printed no figure\n{report}"


@pytest.mark.slow
@pytest.mark.parametrize(("script", "lines"), [
    ("kv.py", ("ratio mutate_in/SET", "lookup_in/GET")),
    ("kv_instructions.py", ("MUTATE_IN workload", "LOOKUP_IN workload")),
])
def test_subdoc_smoke(script, lines, tmp_path):
    """The --subdoc figures (sub-document commands against GET/SET) run end to end too."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TMPDIR=str(tmp_path))
    proc = run_group([sys.executable, str(BENCH / script), "--smoke", "--subdoc"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(line in proc.stdout for line in lines), proc.stdout
