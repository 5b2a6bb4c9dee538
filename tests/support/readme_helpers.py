"""Run the code blocks of README.md and docs/*.md: the parser, the runner and a section's context.

Sybil parses each page: it hands us each fenced block with its whole info string and its
position. The evaluation is ours, so shell blocks run in bash against a real broker with their
exit status and output checked, a section's Python blocks run in one fresh interpreter of their
own, and ``text output`` blocks are compared with what the block before printed.

Conventions in the pages (the info string after the opening fence):

* ```` ```sh ```` and ```` ```python ````: run; ```` ```sh no-run ```` / ```` ```python no-run ````
  (optionally followed by a reason): shown but not run, because it needs a cluster, runs until
  stopped or takes minutes. ``tests/project/test_readme.py`` lists every such block by its first
  line, so a new one cannot be skipped silently.
* ```` ```text output ````: what the block just before prints (stdout); ``...`` in a line
  matches any text (ids, timestamps, ports), a line that is only ``...`` any number of lines.
* ```` ```toml file=PATH ```` (any language): the block is written to PATH in the working
  directory before the blocks after it run (a configuration file the next commands read).
* A shell command followed by ``# error: [CODE] ...`` must fail with ``[CODE]`` on stderr.
* Other languages (``text``, ``toml``, ...) are illustrations and are not run.

A page's section (``## Title``) is the unit: it gets its own broker, a fresh temporary working
directory, one shell environment and one fresh Python interpreter
(``tests/support/doc_python_child.py``) that runs the section's ``python`` blocks in order in
one namespace. Nothing of the test run is shared with it, a SparkSession included: a section
must create everything it uses, as a reader's would. The pages' default address
``127.0.0.1:9392`` stands for the reader's broker: it is replaced by the test broker's address,
and ``LOGSTORE_BOOTSTRAP`` is set to it. A line that starts the reader's broker in the
background (``logstore broker start ... &``) is replaced by a note, because the test has
started that broker already (on ``data`` in the working directory, as the page's does).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sybil import Document, Region, Sybil
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
VENV_BIN = Path(sys.executable).parent
PYTHON_CHILD = Path(__file__).with_name("doc_python_child.py")
DEFAULT_ADDRESS = "127.0.0.1:9392"
RUN_LANGUAGES = {"sh", "python"}
EXPECTED_ERROR = re.compile(r"^(?P<command>.*?)\s+# error: \[(?P<code>[A-Z_]+)\].*$")

# Lines of shell blocks that the test stands in for (a regex, and what runs instead).
SHELL_STAND_INS = [
    (re.compile(r"^make setup && source \.venv/bin/activate$"), ": venv of the test run on PATH"),
    (re.compile(r"^logstore broker start --data-dir data &.*$"), ": broker started by the test"),
]


def pages() -> list[Path]:
    """The pages whose examples run: README.md and every ``docs/*.md``."""
    return [README, *sorted(DOCS.glob("*.md"))]


@dataclass
class Block:
    """One fenced block: its language, the rest of its info string, its source and place."""

    language: str
    flags: str
    source: str
    line: int  # of the opening fence, 1-based
    section: str
    page: str = "README.md"  # relative to the repository

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

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _parse_blocks(document: Document) -> list[Region]:
    lexer = RawFencedCodeBlockLexer(
        info_pattern=re.compile(r"(?P<language>[\w-]*)[ \t]*(?P<flags>[^\n]*)$\n", re.MULTILINE),
    )
    regions = []
    for region in lexer(document):
        region.parsed = region.lexemes["source"]
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


def load_page(path: Path) -> list[Block]:
    """The fenced blocks of one page, in order, each with its ``##`` section."""
    document = Sybil(parsers=[_parse_blocks]).parse(path)
    headings = _sections(document.text)
    page = path.relative_to(REPO).as_posix()
    blocks = []
    for example in document.examples():
        region = example.region
        section = "(top)"
        for offset, title in headings:
            if offset <= region.start:
                section = title
        lexemes = region.lexemes
        blocks.append(Block(
            language=lexemes["language"],
            flags=lexemes["flags"].strip(),
            source=str(lexemes["source"]),
            line=example.line,
            section=section,
            page=page,
        ))
    return blocks


def load_pages() -> list[Block]:
    """Every block of every page (README.md first, then ``docs/*.md`` by name)."""
    return [block for path in pages() for block in load_page(path)]


def find_block(blocks: list[Block], first_line: str) -> Block:
    """The one block whose first line is ``first_line`` (on whichever page it now is)."""
    found = [b for b in blocks if b.first_line == first_line]
    assert len(found) == 1, f"{len(found)} blocks start with {first_line!r}: {[b.where for b in found]}"
    return found[0]


# ---------------------------------------------------------------- running a section


class PythonChild:
    """A fresh interpreter running one section's ``python`` blocks (``doc_python_child.py``)."""

    def __init__(self, workdir: Path, env: dict[str, str], log: Path) -> None:
        self._log = log
        self._stderr = log.open("wb")
        self._proc = subprocess.Popen(
            [sys.executable, "-u", str(PYTHON_CHILD)], cwd=workdir, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
        )

    def run(self, source: str, path: Path, first_line: int, timeout_s: float) -> tuple[bool, str, str]:
        """Run one block; ``(ok, stdout, error)``. Raise AssertionError if the child died or hung."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        request = {"source": source, "path": str(path), "first_line": first_line}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        reply = self._read_line(self._proc.stdout, timeout_s)
        if not reply:
            code = self._proc.poll()
            state = f"exited with code {code}" if code is not None else f"no answer in {timeout_s:.0f} s"
            tail = self.stderr_tail()
            self.close(wait_s=0)
            raise AssertionError(f"the section's Python process {state}\n--- its stderr\n{tail}")
        answer = json.loads(reply)
        return answer["ok"], answer["stdout"], answer["error"]

    @staticmethod
    def _read_line(stream: IO[str], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return ""
            ready, _, _ = select.select([stream], [], [], left)
            if ready:
                return stream.readline()

    def stderr_tail(self, chars: int = 4000) -> str:
        self._stderr.flush()
        return self._log.read_text(errors="replace")[-chars:]

    def close(self, wait_s: float = 60.0) -> None:
        """Ask the child to stop its Spark session and exit; kill it after ``wait_s``."""
        if self._proc.poll() is None and wait_s > 0:
            assert self._proc.stdin is not None
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self._proc.stdin.write(json.dumps({"exit": True}) + "\n")
                self._proc.stdin.close()
                self._proc.wait(wait_s)
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None and not stream.closed:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stderr.close()


@dataclass
class SectionContext:
    """What the blocks of one section share while they run."""

    workdir: Path
    bootstrap: str
    env: dict[str, str]
    last_output: str = ""
    stand_ins_used: set[str] = field(default_factory=set)
    timeout_s: float = 180.0
    python_timeout_s: float = 300.0  # a block that starts a Spark JVM (and resolves Delta) is slow
    python: PythonChild | None = None

    def close(self) -> None:
        if self.python is not None:
            self.python.close()
            self.python = None


def run_block(block: Block, ctx: SectionContext) -> None:
    """Run ``block`` in ``ctx``; raise AssertionError naming the page and line on failure."""
    started = time.monotonic()
    try:
        if block.language == "sh" and block.runs:
            _run_shell(block, ctx)
        elif block.language == "python" and block.runs:
            _run_python(block, ctx)
        elif block.language == "text" and block.flags.startswith("output"):
            _check_output(block, ctx)
        elif block.flags.startswith("file="):
            target = ctx.workdir / block.flags.removeprefix("file=").split()[0]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_localize(block.source, ctx))
    except AssertionError as exc:
        raise AssertionError(f"{block.where} ({block.first_line!r}): {exc}") from exc
    finally:
        print(f"{block.where} {block.language}: {time.monotonic() - started:.1f}s")


def _localize(source: str, ctx: SectionContext) -> str:
    return source.replace(DEFAULT_ADDRESS, ctx.bootstrap)


def _run_shell(block: Block, ctx: SectionContext) -> None:
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
                f"if {command} 2>.readme-stderr; then echo 'succeeded, the page shows [{code}]' >&2;"
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


def _run_python(block: Block, ctx: SectionContext) -> None:
    if ctx.python is None:
        ctx.python = PythonChild(ctx.workdir, ctx.env, ctx.workdir.parent / "python-child.stderr")
    ok, stdout, error = ctx.python.run(
        _localize(block.source, ctx), REPO / block.page, block.line + 1, ctx.python_timeout_s)
    ctx.last_output = stdout
    sys.stdout.write(stdout)
    if not ok:
        raise AssertionError(
            f"raised\n{error}--- stdout\n{stdout[-3000:]}\n--- the process's stderr\n"
            f"{ctx.python.stderr_tail()}"
        )


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


def _check_output(block: Block, ctx: SectionContext) -> None:
    if not output_matches(block.source, ctx.last_output):
        diff = "".join(difflib.unified_diff(
            block.source.splitlines(keepends=True), ctx.last_output.splitlines(keepends=True),
            fromfile=f"{block.where} (expected; '...' matches anything)", tofile="actual"))
        raise AssertionError(f"output differs from the page\n{diff}")
