"""Quiet jobs: ``logstore jobs compact|materialize`` print our lines only; Ctrl-C is one line.

The Spark tests run the real commands (``python -m jobs.cli ...``, the same
click group as ``logstore jobs``) as subprocesses against a real embedded
broker, with stdout and stderr piped (so no progress bars: those are drawn on
a terminal only), and check every line against the allow-list of our
formats below: no JVM warnings, no Ivy report, no Spark banners, no py4j.
They are slow (a JVM each, ~30 s), so there are two; the views section of docs/compaction-and-views.md runs
``materialize --available-now`` and compares its whole output (four lines of ours).

The filter itself (:mod:`jobs.jvm_stderr`) and the bars (:mod:`jobs.progress`)
are checked without Spark.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
from compaction_helpers import compact_topic, produce_batches
from rich.console import Console

from jobs.jvm_stderr import is_chatter, without_ivy_report
from logstore.client.admin import Admin
from logstore.client.producer import Producer

REPO = Path(__file__).resolve().parents[2]
NOW_MS = int(time.time() * 1000)

# Every line a job prints, by who prints it.
OURS = re.compile(
    r"^(?:\d\d:\d\d:\d\d \S"                                              # logstore.compaction progress
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?:INFO|WARNING) logstore\.jobs\."  # logstore.jobs lines
    r"|compaction of '"                                                   # the summary table's title
    r"|[┏┃┡│└]"                                                           # ... and its rows
    r"|interrupted: stopped the view of \S+ (?:after batch \d+|before a batch completed); "
    r"rerun resumes from its checkpoint$"
    r")"
)


def foreign(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip() and not OURS.match(line)]


def run_job(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("LOGSTORE_SPARK_VERBOSE", None)
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------- the real commands


@pytest.mark.timeout(300)
def test_compact_prints_our_lines_and_the_summary_once(shared_broker) -> None:  # type: ignore[no-untyped-def]
    with Admin(shared_broker.bootstrap) as admin:
        topic = compact_topic(admin, "quiet-compact", segment_bytes=1024)
    with Producer(shared_broker.bootstrap, linger_ms=0) as producer:
        produce_batches(producer, topic, [[(NOW_MS, b"k%d" % (i % 3), b"v" * 200)] for i in range(8)])
    proc = run_job("compact", "--bootstrap", shared_broker.bootstrap, "--topic", topic)
    lines = proc.stdout.splitlines() + proc.stderr.splitlines()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert foreign(lines) == [], "\n".join(lines)
    assert sum("size before" in line for line in lines) == 1, "the summary table is printed once"
    assert "latest offsets per key computed" in proc.stderr   # our progress is still there
    assert re.search(r"│\s+0 │ \d+->\d+ .* ok", proc.stdout), proc.stdout


# `logstore jobs materialize --available-now` printing our four lines and nothing else is
# checked by the views section of docs/compaction-and-views.md (tests/project/test_readme.py compares its whole output), which
# runs the same command: one Spark JVM fewer here.


@pytest.mark.timeout(300)
def test_ctrl_c_stops_a_streaming_view_with_one_line(shared_broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = _users_topic(shared_broker.bootstrap, "quiet-sigint")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("LOGSTORE_SPARK_VERBOSE", None)
    # Its own process group, signalled as a whole: what a terminal's Ctrl-C does.
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "materialize", "--bootstrap", shared_broker.bootstrap,
         "--topic", topic, "--table", str(tmp_path / "view")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 200
        while not any("batch 0:" in line for line in list(lines)):
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "no first batch:\n" + "".join(lines)
            time.sleep(0.1)
        before = len(lines)
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    reader.join(timeout=30)
    text = "".join(lines)
    assert rc == 130, text
    assert len(lines) - before <= 2, text
    assert "Traceback" not in text and "py4j" not in text, text
    assert foreign([line.rstrip("\n") for line in lines]) == [], text
    assert lines[-1].startswith("interrupted: stopped the view of"), text


def _users_topic(bootstrap: str, prefix: str) -> str:
    with Admin(bootstrap) as admin:
        topic = compact_topic(admin, prefix)
    with Producer(bootstrap, linger_ms=0) as producer:
        produce_batches(producer, topic, [[(NOW_MS, b"1", b"Ada"), (NOW_MS, b"2", b"Ben"),
                                           (NOW_MS, b"1", b"Ada Lovelace")]])
    return topic


# ---------------------------------------------------------------- the filter and the bars, no Spark

# Lines of a real run (pyspark 4.2, delta-spark 4.4.0, Java 17), tabs as printed.
CHATTER = """\
WARNING: Using incubator modules: jdk.incubator.vector
Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties
Setting default log level to "WARN".
To adjust logging level use sc.setLogLevel(newLevel). For SparkR, use setLogLevel(newLevel).
:: loading settings :: url = jar:file:/x/pyspark/jars/ivy-2.5.3.jar!/org/apache/ivy/core/settings/ivysettings.xml
Ivy Default Cache set to: /root/.ivy2.5.2/cache
The jars for the packages stored in: /root/.ivy2.5.2/jars
io.delta#delta-spark_4.2_2.13 added as a dependency
:: resolving dependencies :: org.apache.spark#spark-submit-parent-3f4c565f;1.0
\tconfs: [default]
\tfound io.delta#delta-spark_4.2_2.13;4.4.0 in central
:: resolution report :: resolve 967ms :: artifacts dl 26ms
\t:: modules in use:
\tcom.fasterxml.jackson.core#jackson-core;2.13.5 from central in [default]
\t:: evicted modules:
\torg.slf4j#slf4j-api;2.0.17 by [org.slf4j#slf4j-api;2.0.13] in [default]
\t---------------------------------------------------------------------
\t|                  |            modules            ||   artifacts   |
:: retrieving :: org.apache.spark#spark-submit-parent-3f4c565f
\t0 artifacts copied, 33 already retrieved (0kB/8ms)
I1126 15:08:42.514952   22293 fork_posix.cc:71] Other threads are currently calling into gRPC, skipping fork() handlers
"""

NOT_CHATTER = """\
:: UNRESOLVED DEPENDENCIES ::
\t:: io.delta#delta-spark_4.2_2.13;9.9.9: not found
Exception in thread "main" java.lang.RuntimeException: [unresolved dependency: io.delta#x;9.9.9: not found]
\tat org.apache.spark.deploy.SparkSubmit.main(SparkSubmit.scala)
spark ERROR Executor: Exception in task 0.0 in stage 1.0 (TID 1)
Traceback (most recent call last):
"""


def test_chatter_patterns_match_the_start_up_lines_and_no_error() -> None:
    assert [line for line in CHATTER.splitlines() if not is_chatter(line)] == []
    assert [line for line in NOT_CHATTER.splitlines() if is_chatter(line)] == []


# A first run's report (a fresh Ivy cache; lines of a real run, most of its 264 left out).
FIRST_RUN = """\
:: loading settings :: url = jar:file:/x/pyspark/jars/ivy-2.5.3.jar!/org/apache/ivy/core/settings/ivysettings.xml
Ivy Default Cache set to: /tmp/ivytest/cache
io.delta#delta-spark_4.2_2.13 added as a dependency
:: resolving dependencies :: org.apache.spark#spark-submit-parent-cd2752eb;1.0
\tfound io.delta#delta-storage;4.4.0 in central
You probably access the destination server through a proxy server that is not well configured.
downloading https://repo1.maven.org/maven2/io/delta/delta-storage/4.4.0/delta-storage-4.4.0.jar ...
\t[SUCCESSFUL ] io.delta#delta-storage;4.4.0!delta-storage.jar (55ms)
:: resolution report :: resolve 11023ms :: artifacts dl 3615ms
\t|      default     |   37  |   33  |   33  |   4   ||   33  |   33  |

:: problems summary ::
:::: WARNINGS
\tHost repos.spark-packages.org not found. url=https://repos.spark-packages.org/org/apache/apache/33/apache-33.jar

:: USE VERBOSE OR DEBUG MESSAGE LEVEL FOR MORE DETAILS
:: retrieving :: org.apache.spark#spark-submit-parent-cd2752eb
\tconfs: [default]
\t33 artifacts copied, 0 already retrieved (87061kB/181ms)
"""


def test_a_resolved_first_run_report_goes_whole_and_an_unfinished_one_stays() -> None:
    lines = ["WARNING: Using incubator modules: jdk.incubator.vector", *FIRST_RUN.splitlines(),
             "Setting default log level to \"WARN\"."]
    assert without_ivy_report(lines) == [lines[0], lines[-1]]
    unfinished = FIRST_RUN.splitlines()[:-1]   # Ivy died before "artifacts copied"
    assert without_ivy_report(unfinished) == unfinished


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fail", [False, True])
def test_start_up_output_is_filtered_and_kept_whole_on_failure(fail: bool) -> None:
    """A child started inside the block (as the JVM is) keeps the pipe; its chatter goes,
    its errors stay, and when start-up fails everything is shown."""
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        from jobs.jvm_stderr import capturing_jvm_stderr
        late = "sleep 0.5; echo 'Setting default log level to WARN' >&2; echo 'late error' >&2"
        try:
            with capturing_jvm_stderr():
                sys.stderr.write({FIRST_RUN!r}); sys.stderr.flush()
                subprocess.run(["sh", "-c", "echo ':: resolving dependencies :: x' >&2; echo 'boom' >&2"])
                child = subprocess.Popen(["sh", "-c", late])   # lives on, like the JVM
                if {fail}:
                    raise RuntimeError("start-up failed")
            print("ours", file=sys.stderr)
        finally:
            child.wait()
            time.sleep(0.3)   # let the forwarder drain the pipe
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=50, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in proc.stderr.splitlines() if line and not line.startswith((" ", "Traceback"))]
    if fail:
        assert proc.returncode == 1
        report = [line for line in FIRST_RUN.splitlines() if line]
        assert lines[:len(report) + 2] == [*report, ":: resolving dependencies :: x", "boom"], proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert lines == ["boom", "ours", "late error"], proc.stderr


def test_bars_follow_a_compaction_and_a_catch_up() -> None:
    from jobs.progress import CatchUpBar, CompactionBars, _offset_sum
    from logstore.types import TopicPartition

    assert _offset_sum({"t": {"0": 10, "1": 25}}) == 35
    assert _offset_sum('{"t": {"0": 4}}') == 4
    assert _offset_sum(None) == 0
    out = io.StringIO()
    bars = CompactionBars("t", console=Console(file=out, force_terminal=True, width=100))  # a terminal
    plan = types.SimpleNamespace(topic="t", partition=0, size_bytes=1000)  # what the bars read of a plan
    with bars:
        bars.planned([plan])
        bars.scanned()
        bars.progress(TopicPartition("t", 0), 500, 1000, 7)
        task = bars._bars.tasks[0]
        assert (task.completed, task.total) == (500, 1000) and "7 removed" in task.description
    catch_up = CatchUpBar("t", console=Console(file=out, force_terminal=True, width=100))
    with catch_up:
        catch_up._bars.refresh()   # drawn before the first batch, too
        catch_up.update({"batchId": 3, "sources": [{"endOffset": {"t": {"0": 6}},
                                                     "latestOffset": {"t": {"0": 10}}}]})
        catch_up._bars.refresh()
    task = catch_up._bars.tasks[0]
    assert (task.completed, task.total) == (6, 10) and "batch 3" in task.description
    assert "t-0: rewrite" in out.getvalue() and "6/10 offsets" in out.getvalue()   # drawn


# ---------------------------------------------------------------- starting the JVM

SESSION_PROBE = textwrap.dedent("""
    import sys
    from jobs.spark_session import SparkStartError, local_session
    try:
        spark = local_session("probe", conf=dict(arg.split("=", 1) for arg in sys.argv[1:]))
    except SparkStartError as error:
        print("refused:", error)
        raise SystemExit(3)
    context = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getContext(False)
    print("log4j:", context.getConfiguration().getName())
""")


def run_probe(*conf: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full.pop("LOGSTORE_SPARK_VERBOSE", None)
    return subprocess.run([sys.executable, "-c", SESSION_PROBE, *conf], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=150)


@pytest.mark.timeout(180)
def test_a_log4j_file_under_a_path_with_spaces_is_used(tmp_path: Path) -> None:
    """Spark splits driver Java options at spaces: a checkout under "My Projects" must still start."""
    where = tmp_path / "my projects" / "log4j2 quiet.properties"
    where.parent.mkdir()
    where.write_text((REPO / "jobs" / "log4j2-quiet.properties").read_text())
    proc = run_probe(env={"LOGSTORE_SPARK_LOG4J": str(where)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "log4j: logstore-jobs"


@pytest.mark.timeout(180)
def test_a_jvm_that_cannot_start_says_why_in_the_error() -> None:
    """Not only Py4J's "gateway exited": the error quotes the JVM's own words."""
    proc = run_probe("spark.driver.extraJavaOptions=-Dlogstore.probe=two words")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "refused: the Spark driver JVM exited while starting" in proc.stdout
    assert "Could not find or load main class words" in proc.stdout
