#!/usr/bin/env bash
# Set up a virtualenv in .venv (once) and run the whole test suite plus the linter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
# pytest exits 5 when no test was collected: that is a failure for us, not a pass.
exit $rc
