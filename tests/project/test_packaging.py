"""Packaging: what ``pip install logstore`` and its extras give, and what each import pulls in.

* the broker, the clients and the CLI (``logstore --help``, with plugin
  loading) import without pyspark: ``pip install logstore`` has no Spark;
* ``logstore jobs --help`` loads the jobs plugin and still starts no Spark;
* ``pyproject.toml``: pyspark, pandas and delta-spark only in the ``spark``
  extra; the halves of format ``logstore`` are ``logstore.spark`` entry points;
* the Spark reader and writer packages never import each other, and the
  combined format class pickles by reference into a fresh interpreter.

Every import check runs in a fresh interpreter, so nothing this test process
imported earlier can hide an import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
SPARK_MODULES = ("pyspark", "delta", "jobs", "spark_source", "spark_sink", "compaction")


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter (from the repository root); return its stdout."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def loaded_after(code: str, prefixes: tuple[str, ...] = SPARK_MODULES) -> list[str]:
    """The top-level packages among ``prefixes`` that are in sys.modules after ``code``."""
    out = run_python(textwrap.dedent(code) + textwrap.dedent(f"""
        import sys
        print(sorted({{m.split(".")[0] for m in sys.modules}} & set({list(prefixes)!r})))
    """))
    return ast.literal_eval(out.strip().splitlines()[-1])  # a list printed by the child


def test_broker_clients_and_cli_import_without_spark() -> None:
    loaded = loaded_after("""
        import logstore
        import logstore.broker.embedded
        import logstore.broker.service
        import logstore.client.admin
        import logstore.client.consumer
        import logstore.client.producer
        from logstore import Admin, Consumer, Producer
        import logstore.cli
        from logstore.cli import main
        try:
            main(["--help"], prog_name="logstore")   # plugin commands are added here
        except SystemExit as e:
            assert e.code == 0, e.code
        assert "jobs" in main.commands, sorted(main.commands)  # the plugin is listed, not loaded
    """)
    assert loaded == []


def test_jobs_help_loads_the_plugin_without_starting_spark() -> None:
    loaded = loaded_after("""
        from logstore.cli import main
        try:
            main(["jobs", "--help"], prog_name="logstore")
        except SystemExit as e:
            assert e.code == 0, e.code
    """)
    assert loaded == ["jobs"]  # jobs.cli only: the jobs import Spark when they run


def test_spark_is_an_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = " ".join(project["dependencies"])
    for name in ("pyspark", "pandas", "delta-spark"):
        assert name not in base, name
    spark = project["optional-dependencies"]["spark"]
    assert any(d.startswith("pyspark") for d in spark)
    assert "delta-spark==4.4.0" in spark
    assert any(d.startswith("pandas") and "<3" in d for d in spark)
    assert any(d.startswith("import-linter") for d in project["optional-dependencies"]["dev"])
    assert project["entry-points"]["logstore.spark"] == {
        "source": "spark_source.source:LogstoreDataSource",
        "sink": "spark_sink.sink:LogstoreSinkDataSource",
    }


def test_reader_and_writer_packages_do_not_import_each_other() -> None:
    pytest.importorskip("pyspark")
    assert loaded_after("import spark_source", ("spark_sink",)) == []
    assert loaded_after("import spark_sink", ("spark_source",)) == []


def test_format_class_combines_both_halves_and_pickles_by_reference() -> None:
    pytest.importorskip("pyspark")
    out = run_python("""
        import subprocess, sys
        from pyspark import cloudpickle
        import spark_source
        cls = spark_source.format_class()
        assert cls is spark_source.format_class()
        assert cls.name() == "logstore"
        data = cloudpickle.dumps(cls)
        assert len(data) < 200, len(data)  # a reference, not the class's code
        child = subprocess.run(
            [sys.executable, "-c",
             "import pickle, sys; c = pickle.loads(sys.stdin.buffer.read()); "
             "print(c.__module__, c.__qualname__, c.name(), "
             "c.reader.__module__, c.streamReader.__module__, "
             "c.writer.__module__, c.streamWriter.__module__)"],
            input=data, capture_output=True, check=True)
        print(child.stdout.decode().strip())
    """)
    assert out.split() == ["spark_source.registration", "LogstoreFormat", "logstore",
                           "spark_source.source", "spark_source.source",
                           "spark_sink.sink", "spark_sink.sink"]
