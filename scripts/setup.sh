#!/usr/bin/env bash
# Create .venv with dcpflow installed in editable mode and its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
# Bytecode for the editable install: Spark starts Python processes per query (the stream reader's
# planner on the driver), and where PYTHONDONTWRITEBYTECODE is set each would compile dcpflow anew
# (~50 ms on the query's critical path). A stale .pyc is ignored by Python, so this is only a speed-up.
.venv/bin/python -m compileall -q src
# A wheelhouse for tests/test_plain_install.py, which builds dcpflow's wheel and installs it without
# extras in a fresh venv: the build requirements and the base dependencies (read from
# pyproject.toml) as wheels, so the test itself needs no network.
.venv/bin/python - <<'PY' > .venv/plain-install-requirements.txt
import tomllib
with open("pyproject.toml", "rb") as fh:
    project = tomllib.load(fh)
print("\n".join(project["build-system"]["requires"] + project["project"]["dependencies"]))
PY
.venv/bin/python -m pip download --quiet --only-binary=:all: -d .venv/wheelhouse \
  -r .venv/plain-install-requirements.txt
# Delta Lake's Spark jars (the state table's MERGE INTO runs in Spark): resolved once here, through
# Spark's own Ivy, into .venv/share/dcpflow/jars; sessions list those files in spark.jars and never
# download (src/dcpflow/spark/jars.py). Skipped when the jars for the pinned version are there.
.venv/bin/python -m dcpflow.spark.jars
