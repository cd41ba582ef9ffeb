"""Delta Lake's Spark jars: fetched once at install time, read from local files at every run.

The state table is a Delta table merged inside Spark (state.py), so the JVM needs Delta's Spark
integration (`io.delta:delta-spark_<spark>_<scala>`, Apache-2.0) and what it depends on. Spark can
resolve such jars itself (`spark.jars.packages`), but that reaches Maven Central each time a
session starts, and a run must never download. So `python -m dcpflow.spark.jars` (which
`scripts/setup.sh` runs) lets Spark's own Ivy resolution fetch them once into a throw-away cache
and keeps the resolved jar files in `<venv>/share/dcpflow/jars/`; a session then lists those
files in `spark.jars` and works offline. Spark ships `spark.jars` from the driver to the executors
of a cluster, so nothing has to be installed on the workers.

`python -m dcpflow.spark.jars --print` prints the directory and its jars (comma-separated, as
`--jars` of `spark-submit` takes them), e.g. to start a Spark Connect server with them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: delta-spark 4.4.0 is built for Spark 4.2 (its POM names spark-sql_2.13 4.2.0; the PyPI package
#: of the same version requires pyspark<=4.2.0): the newest Delta release for the newest Spark it
#: supports. Its artifact names the Spark line, as delta's own `configure_spark_with_delta_pip` does.
DELTA_VERSION = "4.4.0"
DELTA_PACKAGE = f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}"
#: What a session needs besides the jars for `MERGE INTO` and `format("delta")` (Delta's docs,
#: "Set up Apache Spark with Delta Lake").
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
MANIFEST = "PACKAGE"  # names the package the directory's jars were resolved for


class JarsMissing(RuntimeError):
    """Delta's jars are not installed where dcpflow looks for them (the message says what to do)."""


def jar_dir() -> Path:
    """Where the jars live: $DCPFLOW_JARS, else `share/dcpflow/jars` of this Python's prefix (the venv)."""
    env = os.environ.get("DCPFLOW_JARS")
    return Path(env) if env else Path(sys.prefix) / "share" / "dcpflow" / "jars"


def delta_jars(directory: Path | None = None) -> list[Path]:
    """The installed jar files of DELTA_PACKAGE, or [] when they are not (or were fetched for another
    version)."""
    directory = directory or jar_dir()
    try:
        if (directory / MANIFEST).read_text().strip() != DELTA_PACKAGE:
            return []
    except OSError:
        return []
    return sorted(directory.glob("*.jar"))


def require_delta_jars() -> list[Path]:
    jars = delta_jars()
    if not jars:
        raise JarsMissing(f"Delta Lake's Spark jars ({DELTA_PACKAGE}) are not installed in {jar_dir()}: run "
                          f"`python -m dcpflow.spark.jars` once (scripts/setup.sh does), or use --state-format "
                          f"snapshot, which needs no jars")
    return jars


def spark_home() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def fetch(directory: Path | None = None, package: str = DELTA_PACKAGE) -> list[Path]:
    """Resolve `package` and its dependencies with Spark's own Ivy (the resolution `--packages`
    does, through `spark-submit` of an empty script: no SparkContext starts) and keep the jars in
    `directory`. Jars Spark already bundles (Scala's library) are left out."""
    directory = directory or jar_dir()
    home = spark_home()
    bundled = {p.name.rsplit("-", 1)[0] for p in (home / "jars").glob("*.jar")}
    with tempfile.TemporaryDirectory(prefix="dcpflow-ivy-") as tmp:
        script = Path(tmp) / "noop.py"
        script.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable)
        done = subprocess.run([str(home / "bin" / "spark-submit"), "--packages", package,
                               "--conf", f"spark.jars.ivy={tmp}/ivy", str(script)],
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
        resolved = sorted((Path(tmp) / "ivy" / "jars").glob("*.jar"))
        if done.returncode != 0 or not resolved:
            raise RuntimeError(f"resolving {package} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        staging = directory.with_name(directory.name + f".{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for jar in resolved:
            # Ivy names a jar <group>_<artifact>-<version>.jar; Spark's own are <artifact>-<version>.jar
            artifact = jar.name.split("_", 1)[-1].rsplit("-", 1)[0]
            if artifact not in bundled:
                shutil.copy2(jar, staging / jar.name)
        (staging / MANIFEST).write_text(package + "\n")
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(staging, directory)
    return delta_jars(directory) if package == DELTA_PACKAGE else sorted(directory.glob("*.jar"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dcpflow.spark.jars", description=__doc__.split("\n\n")[0])
    parser.add_argument("--print", action="store_true", help="print the installed jars (comma-separated) and exit")
    parser.add_argument("--force", action="store_true", help="fetch again even if they are installed")
    args = parser.parse_args(argv)
    if args.print:
        jars = delta_jars()
        if not jars:
            print(f"no Delta jars in {jar_dir()}: run python -m dcpflow.spark.jars", file=sys.stderr)
            return 1
        print(",".join(str(j) for j in jars))
        return 0
    if delta_jars() and not args.force:
        print(f"{DELTA_PACKAGE}: {len(delta_jars())} jars already in {jar_dir()}")
        return 0
    jars = fetch()
    print(f"{DELTA_PACKAGE}: {len(jars)} jars in {jar_dir()}: " + ", ".join(j.name for j in jars))
    return 0


if __name__ == "__main__":
    sys.exit(main())
