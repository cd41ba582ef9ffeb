#!/usr/bin/env bash
# Set up a virtualenv in .venv (once) and run the whole test suite plus the linter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench
set +e
# Two pytest-xdist workers (the machine's two cores): while one worker waits on a server, a JVM
# or a subprocess, the other runs tests. `--dist loadgroup` keeps every test of the shared
# SparkSession on one worker (tests/spark/conftest.py), and slow tests start first
# (tests/conftest.py). DCPFLOW_TEST_WORKERS=0 runs everything in this one process.
.venv/bin/python -m pytest -n "${DCPFLOW_TEST_WORKERS:-2}" --dist loadgroup "$@"
rc=$?
set -e
# pytest exits 5 when no test was collected: that is a failure for us, not a pass.
exit $rc
