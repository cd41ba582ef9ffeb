"""The local session's Python workers: what they import PySpark from."""


def test_python_workers_import_pyspark_from_its_installed_package_not_the_zip(spark):
    """Spark puts its pyspark.zip first on a worker's PYTHONPATH, and Python compiles every module
    it imports from a zip at each start (no bytecode cache there): on a loaded machine a worker
    Spark starts per query then missed Spark's fixed 10 s to connect back, failing the query.
    Workers of a local session import the installed, compiled package instead."""
    where = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("pyspark").__file__).collect()[0]
    assert ".zip" not in where and where.endswith("__init__.py"), where
