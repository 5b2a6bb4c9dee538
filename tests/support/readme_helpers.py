"""Run README.md's code blocks with Sybil: the parser, the evaluators and a section's context.

Why Sybil (not pytest-codeblocks): it hands us each fenced block with its whole info string and
its position, and lets us supply our own evaluators, so shell blocks can run in bash against a
real broker with their exit status and output checked, Python blocks can share one namespace per
README section, and ``text output`` blocks can be compared with what the block before printed.
pytest-codeblocks runs Python and shell blocks in fixed ways (one subprocess per block, no shared
state, no broker) and knows no per-section context.

Conventions in README.md (the info string after the opening fence):

* ```` ```sh ```` and ```` ```python ````: run; ```` ```sh no-run ```` / ```` ```python no-run ````
  (optionally followed by a reason): shown but not run, because it needs a cluster, runs until
  stopped or takes minutes. ``tests/project/test_readme.py`` lists every such block by its first line,
  so a new one cannot be skipped silently.
* ```` ```text output ````: what the block just before prints (stdout); ``...`` in a line
  matches any text (ids, timestamps, ports), a line that is only ``...`` any number of lines.
* ```` ```toml file=PATH ```` (any language): the block is written to PATH in the working
  directory before the blocks after it run (a configuration file the next commands read).
* A shell command followed by ``# error: [CODE] ...`` must fail with ``[CODE]`` on stderr.
* Other languages (``text``, ``toml``, ...) are illustrations and are not run.

A README section (``## Title``) is the unit: it gets its own broker, a fresh temporary working
directory, one Python namespace and one shell environment, and must create everything it uses.
The README's default address ``127.0.0.1:9392`` stands for the reader's broker: it is replaced by
the test broker's address, and ``LOGSTORE_BOOTSTRAP`` is set to it. A line that starts the
reader's broker in the background (``logstore broker start ... &``) is replaced by a note,
because the test has started that broker already (on ``data`` in the working directory, as the
README's does).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

README = Path(__file__).resolve().parents[2] / "README.md"
VENV_BIN = Path(sys.executable).parent
DEFAULT_ADDRESS = "127.0.0.1:9392"
RUN_LANGUAGES = {"sh", "python"}
EXPECTED_ERROR = re.compile(r"^(?P<command>.*?)\s+# error: \[(?P<code>[A-Z_]+)\].*$")

# Lines of shell blocks that the test stands in for (a regex, and what runs instead).
SHELL_STAND_INS = [
    (re.compile(r"^make setup && source \.venv/bin/activate$"), ": venv of the test run on PATH"),
    (re.compile(r"^logstore broker start --data-dir data &.*$"), ": broker started by the test"),
]


@dataclass
class Block:
    """One fenced block: its language, the rest of its info string, its source and place."""

    language: str
    flags: str
    source: str
    line: int
    section: str

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and not self.flags.startswith("no-run")

    @property
    def evaluated(self) -> bool:
        """Run, compared with the output before it, or written to a file."""
        return self.runs or self.flags.startswith("file=") or (
            self.language == "text" and self.flags.startswith("output"))

    @property
    def first_line(self) -> str:
        return next((ln.strip() for ln in self.source.splitlines() if ln.strip()), "")


@dataclass
class SectionContext:
    """What the blocks of one README section share while they run."""

    workdir: Path
    bootstrap: str
    env: dict[str, str]
    namespace: dict[str, Any] = field(default_factory=dict)
    last_output: str = ""
    stand_ins_used: set[str] = field(default_factory=set)
    timeout_s: float = 180.0


def _parse_blocks(document: Document) -> list[Region]:
    lexer = RawFencedCodeBlockLexer(
        info_pattern=re.compile(r"(?P<language>[\w-]*)[ \t]*(?P<flags>[^\n]*)$\n", re.MULTILINE),
    )
    regions = []
    for region in lexer(document):
        region.parsed = region.lexemes["source"]
        region.evaluator = evaluate_block
        regions.append(region)
    return regions


def _sections(text: str) -> list[tuple[int, str]]:
    """``(offset, title)`` of every ``## `` heading outside fenced blocks."""
    out, fenced, offset = [], False, 0
    for ln in text.splitlines(keepends=True):
        if ln.startswith("```"):
            fenced = not fenced
        elif not fenced and ln.startswith("## "):
            out.append((offset, ln[3:].strip()))
        offset += len(ln)
    return out


def load_readme() -> tuple[Document, list[tuple[Block, Example]]]:
    """README.md parsed by Sybil, each example paired with its :class:`Block`."""
    document = Sybil(parsers=[_parse_blocks]).parse(README)
    headings = _sections(document.text)
    pairs = []
    for example in document.examples():
        region = example.region
        section = "(top)"
        for offset, title in headings:
            if offset <= region.start:
                section = title
        lexemes = region.lexemes
        block = Block(
            language=lexemes["language"],
            flags=lexemes["flags"].strip(),
            source=str(lexemes["source"]),
            line=example.line,
            section=section,
        )
        pairs.append((block, example))
    return document, pairs


# ---------------------------------------------------------------- evaluation


def evaluate_block(example: Example) -> str | None:
    """Sybil evaluator: dispatch on the block's language (set up by :func:`run_block`)."""
    block: Block = example.namespace["__block__"]
    ctx: SectionContext = example.namespace["__ctx__"]
    if block.language == "sh":
        return _run_shell(block, ctx)
    if block.language == "python":
        return _run_python(block, ctx)
    if block.language == "text" and block.flags.startswith("output"):
        return _check_output(block, ctx)
    if block.flags.startswith("file="):
        target = ctx.workdir / block.flags.removeprefix("file=").split()[0]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_localize(block.source, ctx))
    return None


def run_block(document: Document, block: Block, example: Example, ctx: SectionContext) -> None:
    """Evaluate ``example`` in ``ctx``; raise AssertionError naming the README line on failure."""
    document.namespace["__block__"] = block
    document.namespace["__ctx__"] = ctx
    started = time.monotonic()
    try:
        example.evaluate()
    except AssertionError as exc:
        raise AssertionError(f"README.md line {block.line} ({block.first_line!r}): {exc}") from exc
    finally:
        print(f"README.md:{block.line} {block.language}: {time.monotonic() - started:.1f}s")


def _localize(source: str, ctx: SectionContext) -> str:
    return source.replace(DEFAULT_ADDRESS, ctx.bootstrap)


def _run_shell(block: Block, ctx: SectionContext) -> str | None:
    lines = []
    for ln in _localize(block.source, ctx).splitlines():
        for pattern, instead in SHELL_STAND_INS:
            if pattern.match(ln.strip()):
                ctx.stand_ins_used.add(pattern.pattern)
                ln = instead
        expected = EXPECTED_ERROR.match(ln)
        if expected:
            command, code = expected["command"], expected["code"]
            ln = (
                f"if {command} 2>.readme-stderr; then echo 'succeeded, README shows [{code}]' >&2;"
                f" false; fi; grep -qF '[{code}]' .readme-stderr"
            )
        lines.append(ln)
    # errexit: the first failing command fails the block (and says which one).
    script = "set -eo pipefail\ntrap 'echo \"failed: $BASH_COMMAND\" >&2' ERR\n" + "\n".join(lines)
    proc = subprocess.run(
        ["bash", "-c", script], cwd=ctx.workdir, env=ctx.env, capture_output=True,
        text=True, timeout=ctx.timeout_s,
    )
    ctx.last_output = proc.stdout
    if proc.returncode != 0:
        raise AssertionError(
            f"exit code {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
            f"\n--- stderr\n{proc.stderr[-3000:]}"
        )
    return None


def _run_python(block: Block, ctx: SectionContext) -> str | None:
    source = _localize(block.source, ctx)
    code = compile(source, f"README.md:{block.line}", "exec")
    buffer = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ctx.workdir)
    _spark_working_directory(ctx)
    try:
        with contextlib.redirect_stdout(buffer):
            exec(code, ctx.namespace)
    finally:
        os.chdir(cwd)
    ctx.last_output = buffer.getvalue()
    sys.stdout.write(ctx.last_output)
    return None


def _spark_working_directory(ctx: SectionContext) -> None:
    """Resolve Spark's relative paths in the working directory, as in a reader's own shell.

    The suite's one SparkSession was started elsewhere; Hadoop's local file system resolves
    relative paths against its working directory, which is per (cached) file system object.
    """
    spark = ctx.namespace.get("spark")
    if spark is None:
        return
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)
    fs.setWorkingDirectory(jvm.org.apache.hadoop.fs.Path(f"file://{ctx.workdir}"))


def point_spark_at(spark: Any, bootstrap: str | None) -> None:
    """Make ``$LOGSTORE_BOOTSTRAP`` in Spark's Python workers ``bootstrap`` (None: unset it).

    Python data sources and UDFs run in worker processes whose environment is
    ``SparkContext.environment`` as it was when the data source was registered or the function
    wrapped, not the driver's ``os.environ``; the README's blocks that rely on the default
    address must see this section's broker, so the format is registered again here.
    """
    import spark_source

    environment = spark.sparkContext.environment
    if bootstrap is None:
        environment.pop("LOGSTORE_BOOTSTRAP", None)
    else:
        environment["LOGSTORE_BOOTSTRAP"] = bootstrap
    spark_source.register(spark)


def output_matches(expected: str, actual: str) -> bool:
    """``...`` inside a line matches any text; a line of only ``...`` any number of lines."""
    parts = []
    for ln in expected.strip("\n").splitlines():
        if ln.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(r"[^\n]*?".join(re.escape(p) for p in ln.rstrip().split("...")) + r"[ \t]*\n")
    lines = [ln.rstrip() for ln in actual.strip("\n").splitlines()]
    return re.fullmatch("".join(parts), "".join(ln + "\n" for ln in lines)) is not None


def _check_output(block: Block, ctx: SectionContext) -> str | None:
    if not output_matches(block.source, ctx.last_output):
        raise AssertionError(
            f"output differs from README\n--- README\n{block.source}--- actual\n{ctx.last_output}"
        )
    return None
