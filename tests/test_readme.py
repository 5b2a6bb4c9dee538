"""README.md's examples, run as tests (issue 13: "every README example runs, in CI").

Each README section (``## Title``) with runnable blocks is one test: a real embedded broker on a
free port with its data in ``data`` of a fresh working directory, the venv's ``logstore`` on
PATH, ``LOGSTORE_BOOTSTRAP`` set, and every ``sh``/``python`` block run in order (exit codes
checked, ``text output`` blocks compared). The conventions are in ``tests/readme_helpers.py``.
Blocks marked ``no-run`` are listed below by their first line; a new one fails
``test_skipped_blocks_are_the_listed_ones`` until it is listed here with its reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from readme_helpers import (
    SHELL_STAND_INS,
    VENV_BIN,
    Block,
    SectionContext,
    load_readme,
    output_matches,
    run_block,
)

from logstore.broker.embedded import EmbeddedBroker

DOCUMENT, BLOCKS = load_readme()
SECTIONS = sorted({b.section for b, _ in BLOCKS if b.runs}, key=lambda s: [
    b.line for b, _ in BLOCKS if b.section == s][0])

# Blocks shown but not run, by first line, and why (README marks them ```sh no-run).
NOT_RUN = {
    "make demo   # creates .venv, installs everything, runs the main job on the embedded broker":
        "builds a venv and runs the whole demo / test suite: minutes",
    "logstore broker start                        # conf/broker.toml if present, else defaults":
        "brokers in the foreground until Ctrl-C (the tests start their own)",
    "$ logstore dev cluster --brokers 3 --data-dir /tmp/devc":
        "a cluster until Ctrl-C (tests/test_local_cluster.py runs it)",
}


@pytest.fixture
def section_ctx(tmp_path: Path) -> Iterator[SectionContext]:
    """A broker and a working directory for one README section."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    with EmbeddedBroker(str(workdir / "data")) as broker:
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env["LOGSTORE_BOOTSTRAP"] = broker.bootstrap
        env.pop("LOGSTORE_PORT", None)
        old = os.environ.get("LOGSTORE_BOOTSTRAP")
        os.environ["LOGSTORE_BOOTSTRAP"] = broker.bootstrap
        ctx = SectionContext(workdir=workdir, bootstrap=broker.bootstrap, env=env)
        try:
            yield ctx
        finally:
            _stop_queries(ctx)
            if old is None:
                os.environ.pop("LOGSTORE_BOOTSTRAP", None)
            else:
                os.environ["LOGSTORE_BOOTSTRAP"] = old


def _stop_queries(ctx: SectionContext) -> None:
    """Stop streaming queries a section left running (its blocks show them running)."""
    spark = ctx.namespace.get("spark")
    if spark is not None:
        for query in spark.streams.active:
            query.stop()


def _uses_spark(section: str) -> bool:
    return any(
        b.section == section and b.runs and b.language == "python"
        and ("spark" in b.source) for b, _ in BLOCKS
    )


@pytest.mark.timeout(900)  # whole sections under load; see the module docstring
@pytest.mark.parametrize("section", SECTIONS)
def test_readme_section(section: str, section_ctx: SectionContext, request) -> None:  # type: ignore[no-untyped-def]
    if _uses_spark(section):
        section_ctx.namespace["spark"] = request.getfixturevalue("spark")
    ran = 0
    for block, example in BLOCKS:
        if block.section != section:
            continue
        if block.evaluated:
            run_block(DOCUMENT, block, example, section_ctx)
            ran += 1
    assert ran > 0


def test_skipped_blocks_are_the_listed_ones() -> None:
    """Every ``no-run`` block is listed with a reason, and every listed one is still there."""
    skipped = {b.first_line for b, _ in BLOCKS if b.language in {"sh", "python"} and not b.runs}
    assert skipped == set(NOT_RUN)


def test_stand_ins_still_match_readme_lines() -> None:
    """The shell lines the test stands in for still occur (else the stand-in list is stale)."""
    for pattern, _ in SHELL_STAND_INS:
        assert any(
            pattern.match(ln.strip()) for b, _ in BLOCKS if b.runs for ln in b.source.splitlines()
        ), pattern.pattern


def test_output_matching_rules() -> None:
    """The ``text output`` comparison: ``...`` inside a line and as a whole line."""
    assert output_matches("a ... c\n...\nend\n", "a bbb c\nx\ny\nend\n")
    assert output_matches("a\n", "a   \n")
    assert not output_matches("a ... c\n", "a b d\n")
    assert not output_matches("a\nb\n", "a\n")


def test_every_section_with_code_is_tested() -> None:
    blocks = [b for b, _ in BLOCKS]
    assert isinstance(blocks[0], Block)
    assert {b.section for b in blocks if b.runs} == set(SECTIONS)
