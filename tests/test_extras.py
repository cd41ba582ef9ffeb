"""Which extra a missing package belongs to (extras.py), read from the installed metadata of
pyproject.toml's optional-dependencies, and the CLI's one-line refusal built on it."""

from dcpflow import cli, extras


def test_a_missing_package_names_the_smallest_extra_that_brings_it():
    def explain(name, extra=None):
        return extras.explain(ModuleNotFoundError(f"No module named {name!r}", name=name), extra)

    assert explain("numpy").endswith("(the 'arrow' extra): pip install 'dcpflow[arrow]'")
    assert explain("numpy", "spark").endswith("pip install 'dcpflow[spark]'")  # the command's own extra
    assert explain("pyspark.sql").startswith("needs pyspark (the 'spark' extra)")
    assert explain("couchbase.cluster").endswith("pip install 'dcpflow[load]'")
    assert explain("grpc").endswith("pip install 'dcpflow[connect]'")  # an extra inside an extra
    assert explain("uvloop").endswith("pip install 'dcpflow[fast]'")
    assert explain("nosuchthing") == "needs the Python package 'nosuchthing', which is not installed"
    assert explain("dcpflow.gone") is None  # a broken install is not a missing extra


def test_installed_extras_pass():
    for extra in ("arrow", "load", "spark"):  # the test environment has them (scripts/setup.sh)
        assert extras.missing(extra) is None


def test_the_cli_refuses_in_one_line(monkeypatch, capsys):
    import dcpflow.client.tail as tail

    def no_arrow(args):
        import pyarrow_that_is_not_there  # noqa: F401

    monkeypatch.setattr(tail, "main", no_arrow)
    monkeypatch.setattr(extras, "_DISTRIBUTION_OF", {"pyarrow_that_is_not_there": "pyarrow"})
    assert cli.main(["tail", "couchbase://127.0.0.1:1/default"]) == 1
    assert capsys.readouterr().err == "dcpflow tail: needs pyarrow (the 'arrow' extra): pip install 'dcpflow[arrow]'\n"
    monkeypatch.setattr(extras, "missing", lambda extra: f"needs x (the '{extra}' extra)")
    assert cli.main(["pipeline", "--connection", "couchbase://h/b", "--lake", "l"]) == 1
    assert capsys.readouterr().err == "dcpflow pipeline: needs x (the 'spark' extra)\n"
