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
# Delta Lake's Spark jars (the state table's MERGE INTO runs in Spark): resolved once here, through
# Spark's own Ivy, into .venv/share/dcpflow/jars; sessions list those files in spark.jars and never
# download (src/dcpflow/spark/jars.py). Skipped when the jars for the pinned version are there.
.venv/bin/python -m dcpflow.spark.jars
