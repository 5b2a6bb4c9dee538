"""The examples of README.md and docs/*.md, run as tests (issue 13: "every README example runs, in
CI"; issue 27: the reference moved to ``docs/``, its examples with it).

Each section (``## Title``) of a page with runnable blocks is one test: a real embedded broker on
a free port with its data in ``data`` of a fresh working directory, the venv's ``logstore`` on
PATH, ``LOGSTORE_BOOTSTRAP`` set, every ``sh`` block run in bash and every ``python`` block in
one fresh Python interpreter of the section's own, in order (exit codes checked, ``text output``
blocks compared). Nothing is shared between sections, not even a SparkSession: an example that
relies on another section's state fails here as it would for a reader. The conventions are in
``tests/support/readme_helpers.py``. Blocks marked ``no-run`` are listed below by their first
line; a new one fails ``test_skipped_blocks_are_the_listed_ones`` until it is listed here with
its reason.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from readme_helpers import (
    SHELL_STAND_INS,
    VENV_BIN,
    Block,
    SectionContext,
    find_block,
    load_pages,
    output_matches,
    run_block,
)

from logstore.broker.embedded import EmbeddedBroker

BLOCKS = load_pages()
# (page, section) of every section with a block that runs, in page order.
SECTIONS = list(dict.fromkeys((b.page, b.section) for b in BLOCKS if b.runs))

# Blocks shown but not run, by first line, and why (the pages mark them ```sh no-run).
NOT_RUN = {
    'logstore broker start --kafka-listener 127.0.0.1:9092   # or kafka_listener = "127.0.0.1:9092" in conf/broker.toml':
        "a broker in the foreground until Ctrl-C (the Python block after it starts one with a Kafka listener)",
    'df = (spark.read.format("kafka")                       # Spark\'s connector, as against Kafka':
        "needs Spark's Kafka connector package in the JVM (tests/spark/test_spark_kafka_connector.py runs it)",
    "make demo   # creates .venv, installs everything, runs the main job on the embedded broker":
        "builds a venv and runs the whole demo / test suite: minutes",
    "logstore broker start                        # conf/broker.toml if present, else defaults":
        "brokers in the foreground until Ctrl-C (the tests start their own)",
    "$ logstore dev cluster --brokers 3 --data-dir /tmp/devc":
        "a cluster until Ctrl-C (tests/e2e/test_local_cluster.py runs it)",
    "logstore partitions recover --data-dir data --topic orders --partition 2"
    "                      # what is wrong (exit 1 if it still cannot open)":
        "needs a stopped broker with a damaged partition (tests/broker/test_damage.py)",
    "logstore dev cluster --brokers 3 --data-dir /tmp/lc     # etcd + 3 brokers, each its own process":
        "a cluster until Ctrl-C (tests/e2e/test_local_cluster.py runs it)",
    "B=127.0.0.1:36651,127.0.0.1:56119,127.0.0.1:38823":
        "needs a cluster: test_cluster_session runs it against LocalCluster",
    "E=etcd://127.0.0.1:2379":
        "needs a cluster: test_grow_session runs it against LocalCluster",
    ".tools/bin/etcd --data-dir /var/lib/etcd --listen-client-urls http://10.0.0.10:2379 \\":
        "etcd and brokers on several machines",
    "logstore jobs compact --topic profiles --force --format json"
    "         # every partition, a JSON summary":
        "the compaction run above through other entry points: a Spark JVM each "
        "(tests/jobs/test_compaction_job.py runs the job)",
    "# Or keep it running (Ctrl-C / SIGTERM stop it gracefully):":
        "a view until Ctrl-C (the --available-now run above is the same query)",
    "logstore jobs schedule --config conf/jobs.toml          # until Ctrl-C / SIGTERM":
        "the scheduler until Ctrl-C (the --once run above is one of its rounds)",
    "logstore broker start --port 9392 --metrics-port 9393":
        "a broker in the foreground until Ctrl-C (tests/broker/test_metrics.py scrapes one)",
    "logstore console --bootstrap 127.0.0.1:9392 --port 8080     # then open http://127.0.0.1:8080/":
        "the console in the foreground until Ctrl-C (the block after it runs one in the background)",
    "logstore broker start --data-dir secure-data --port 9394 --security-protocol SASL_PLAINTEXT":
        "a SASL broker in the foreground until Ctrl-C (the Python block below runs one embedded)",
    "export LOGSTORE_SECURITY_PROTOCOL=SASL_PLAINTEXT LOGSTORE_SASL_MECHANISM=SCRAM-SHA-256":
        "needs the SASL broker above (tests/broker/test_security_scram.py runs these commands)",
    "logstore broker start --data-dir data --tls-cert certs/broker.pem --tls-key certs/broker.key \\":
        "a broker in the foreground until Ctrl-C (the next block starts the same in the background)",
    "logstore acls create --principal User:alice --operation Write --operation Read --topic orders":
        "needs a SASL broker with the authorizer and the super user's login; tests/broker/test_security_acls.py::"
        "test_the_readme_acl_commands_as_a_logged_in_super_user runs this block's commands",
    "logstore jobs compact --topic profiles --master spark://spark-master:7077 \\":
        "needs a Spark cluster; tests/e2e/test_spark_standalone.py runs these commands",
}


@pytest.fixture
def section_ctx(tmp_path: Path) -> Iterator[SectionContext]:
    """A broker and a working directory for one section."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    with EmbeddedBroker(str(workdir / "data")) as broker:
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env["LOGSTORE_BOOTSTRAP"] = broker.bootstrap
        env.pop("LOGSTORE_PORT", None)
        ctx = SectionContext(workdir=workdir, bootstrap=broker.bootstrap, env=env)
        try:
            yield ctx
        finally:
            ctx.close()  # before the broker stops: the section's queries stop while it answers


# A whole section: the compaction/views one runs three Spark jobs as processes (~200 s at load 5).
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("page", "section"), SECTIONS, ids=[f"{p}::{s}" for p, s in SECTIONS])
def test_doc_section(page: str, section: str, section_ctx: SectionContext) -> None:
    ran = 0
    for block in BLOCKS:
        if block.page == page and block.section == section and block.evaluated:
            run_block(block, section_ctx)
            ran += 1
    assert ran > 0


def test_skipped_blocks_are_the_listed_ones() -> None:
    """Every ``no-run`` block is listed with a reason, and every listed one is still there."""
    skipped = {b.first_line for b in BLOCKS if b.language in {"sh", "python"} and not b.runs}
    assert skipped == set(NOT_RUN)


def test_stand_ins_still_match_readme_lines() -> None:
    """The shell lines the test stands in for still occur on a page (else the list is stale)."""
    for pattern, _ in SHELL_STAND_INS:
        assert any(
            pattern.match(ln.strip()) for b in BLOCKS if b.runs for ln in b.source.splitlines()
        ), pattern.pattern


def test_output_matching_rules() -> None:
    """The ``text output`` comparison: ``...`` inside a line and as a whole line."""
    assert output_matches("a ... c\n...\nend\n", "a bbb c\nx\ny\nend\n")
    assert output_matches("a\n", "a   \n")
    assert not output_matches("a ... c\n", "a b d\n")
    assert not output_matches("a\nb\n", "a\n")


def _bare_context(tmp_path: Path) -> SectionContext:
    """A section's context without a broker, for the runner's own tests."""
    workdir = tmp_path / "work"
    workdir.mkdir(parents=True)
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return SectionContext(workdir=workdir, bootstrap="127.0.0.1:1", env=env, python_timeout_s=60)


@pytest.mark.timeout(120)
def test_python_blocks_share_one_fresh_interpreter_per_section(tmp_path: Path) -> None:
    """A section's blocks share a namespace in a child of this process that imported nothing
    of the test run; it runs in the working directory, and only ``print`` is the output."""
    ctx = _bare_context(tmp_path)
    try:
        run_block(Block("python", "", "import os, sys\nx = 41\nos.write(1, b'fd 1')\n", 3, "s"), ctx)
        check = (f"print(x + 1, os.getppid() == {os.getpid()}, 'pytest' in sys.modules,"
                 " os.getcwd() == sys.path[0])\n")
        run_block(Block("python", "", check, 9, "s"), ctx)
        run_block(Block("text", "output", "42 True False True\n", 12, "s"), ctx)
    finally:
        ctx.close()
    other = _bare_context(tmp_path / "other")
    try:
        with pytest.raises(AssertionError, match="NameError: name 'x' is not defined"):
            run_block(Block("python", "", "print(x)\n", 3, "t"), other)
    finally:
        other.close()


@pytest.mark.timeout(120)
def test_a_failing_block_names_its_page_and_line(tmp_path: Path) -> None:
    ctx = _bare_context(tmp_path)
    try:
        with pytest.raises(AssertionError) as raised:
            run_block(Block("python", "", "x = 1\nraise ValueError('boom')\n", 7, "s", "docs/x.md"), ctx)
        message = str(raised.value)
        assert message.startswith("docs/x.md:7 ('x = 1'): raised"), message
        assert 'x.md", line 9' in message and "ValueError: boom" in message, message
        with pytest.raises(AssertionError) as raised:
            run_block(Block("sh", "", "echo a\nfalse\n", 20, "s", "docs/x.md"), ctx)
        assert str(raised.value).startswith("docs/x.md:20 ('echo a'): exit code 1")
        ctx.last_output = "a\nb\n"
        with pytest.raises(AssertionError) as raised:
            run_block(Block("text", "output", "a\nc\n", 30, "s", "docs/x.md"), ctx)
        assert "docs/x.md:30" in str(raised.value)
        assert "-c\n+b\n" in str(raised.value), str(raised.value)
    finally:
        ctx.close()


CLUSTER_BLOCK = "B=127.0.0.1:36651,127.0.0.1:56119,127.0.0.1:38823"


@pytest.mark.timeout(240)
def test_cluster_session(tmp_path: Path) -> None:
    """The cluster session ("In another terminal", docs/cluster.md) against a real LocalCluster.

    The block's bootstrap line and ``kill -9 <pid of broker 3>`` are the two things a reader
    copies from the dev cluster's output; the test fills them in. Broker 3's death must leave
    every partition led by another broker with 3 out of its ISR (what the block's comments
    show); the stand-in waits for that at most 30 s, since how soon depends on the session.
    """
    from logstore import Admin
    from logstore.dev.local_cluster import LocalCluster

    block = find_block(BLOCKS, CLUSTER_BLOCK)
    with LocalCluster(3, tmp_path / "cluster") as cluster:  # started on entry
        pid = cluster.pid(3)
        assert pid is not None
        source = block.source.replace(CLUSTER_BLOCK, f"B={cluster.bootstrap}")
        wait = (
            f"kill -9 {pid}; for i in $(seq 60); do logstore topics describe orders -b $B"
            " --format json | python -c 'import json,sys; d=json.load(sys.stdin);"
            " sys.exit(any(3 in p[\"isr\"] or p[\"leader\"] == 3 for p in d[\"partitions\"]))'"
            " && break; sleep 0.5; done"
        )
        assert "kill -9 <pid of broker 3>" in source
        source = source.replace("kill -9 <pid of broker 3>", wait)
        workdir = tmp_path / "work"
        workdir.mkdir()
        env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        ctx = SectionContext(workdir=workdir, bootstrap=cluster.bootstrap, env=env)
        run_block(Block("sh", "", source, block.line, block.section, block.page), ctx)
        with Admin(cluster.address(1)) as admin:
            partitions = admin.describe_topics(["orders"])["orders"].partitions
        for p in partitions:
            assert p.leader != 3 and 3 not in p.isr, p


GROW_BLOCK = "E=etcd://127.0.0.1:2379"


@pytest.mark.timeout(240)
def test_grow_session(tmp_path: Path) -> None:
    """The "Grow the cluster" block (docs/cluster.md) against a real LocalCluster: the fourth broker is
    started by the block's own ``logstore broker start`` (on a free port, in this test's
    directory), the topic moves onto 2,3,4 with a throttle, --verify exits 0, the records are
    all there, and the preferred election runs. The block's ``sleep 3`` becomes a wait for the
    broker's registration."""
    import signal
    import socket

    from logstore import Admin
    from logstore.dev.local_cluster import LocalCluster

    block = find_block(BLOCKS, GROW_BLOCK)
    with LocalCluster(3, tmp_path / "cluster") as cluster, socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        base = tmp_path / "lc"
        base.mkdir()
        pid_file = tmp_path / "broker-4.pid"
        wait = ("for i in $(seq 120); do logstore cluster describe -b $B --format json | python -c "
                "'import json,sys; sys.exit(4 not in [b[\"node_id\"] for b in json.load(sys.stdin)[\"brokers\"]])'"
                " && break; sleep 0.5; done")
        source = block.source
        for old, new in ((GROW_BLOCK, f"B={cluster.bootstrap}\nE={cluster.metadata_url}"),
                         ("--port 9396", f"--port {port}"), ("/tmp/lc", str(base)),
                         ("2>&1 &", f"2>&1 & echo $! > {pid_file}"), ("sleep 3", wait)):
            assert old in source, old
            source = source.replace(old, new)
        source = "set -e\n" + source
        workdir = tmp_path / "work"
        workdir.mkdir()
        env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        ctx = SectionContext(workdir=workdir, bootstrap=cluster.bootstrap, env=env)
        try:
            run_block(Block("sh", "", source, block.line, block.section, block.page), ctx)
            with Admin(cluster.address(1)) as admin:
                partitions = admin.describe_topics(["clicks"])["clicks"].partitions
                assert admin.list_partition_reassignments() == {}
            for p in partitions:
                assert set(p.replicas) == {2, 3, 4} and p.leader == p.replicas[0], p
            assert not list((tmp_path / "cluster" / "broker-1").glob("clicks-*"))
        finally:
            if pid_file.exists():
                pid = int(pid_file.read_text())
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                for _ in range(100):
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.1)
