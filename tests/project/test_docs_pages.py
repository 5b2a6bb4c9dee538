"""README.md is the front door and ``docs/`` the reference (issue 27); both stay linked up.

README.md stays short; every relative link of README.md and ``docs/*.md`` names a file that
exists and, with ``#anchor``, a heading of that page (GitHub's anchors: the heading lower-cased,
punctuation dropped, spaces as hyphens, ``-1``, ``-2`` for repeats); every verb of
``logstore --help`` has an example on some page and a row in docs/cli.md's "Every verb";
docs/architecture.md's package table names every root package of ``.importlinter``, the one
map of who may import whom (the page explains the layers and links to it; it does not repeat
the contracts).
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import click
import pytest
from readme_helpers import README, REPO, load_pages, pages

from logstore.cli import main as cli_main
from logstore.cli.plugins import PluginCommand

README_MAX_LINES = 300
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.*)$")


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub makes for the headings of ``text`` (fenced blocks left out)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = HEADING.match(line)
        if fenced or not match:
            continue
        base = re.sub(r"[^\w\- ]", "", match[1].strip().lower()).replace(" ", "-")
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


def relative_links(text: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every link that is not a URL, outside fenced blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out += [(number, t) for t in LINK.findall(line) if not re.match(r"[a-z]+:", t)]
    return out


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """``page:line: target (why)`` for every relative link of ``page`` that leads nowhere."""
    broken = []
    for line, target in relative_links(page.read_text()):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{line}: {target}"
        if not file.exists():
            broken.append(f"{where} (no file {file})")
        elif anchor and (file.suffix != ".md" or anchor not in github_anchors(file.read_text())):
            broken.append(f"{where} (no heading #{anchor} in {file.name})")
    return broken


def test_readme_is_a_front_door() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference text to docs/"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_link_check_finds_broken_links(tmp_path: Path) -> None:
    """The check above can fail: a missing file, a missing heading, and what GitHub makes."""
    (tmp_path / "other.md").write_text("# Title\n## A `cli` verb: (x)\n## Repeat\n## Repeat\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-cli-verb-x) [ok](other.md#repeat-1) [ok](#here)\n# Here\n"
        "```\n[not a link](gone.md)\n```\n[bad](gone.md) [bad](other.md#nope) [url](https://x.y/#z)\n"
    )
    targets = [b.split(": ")[1].split(" ")[0] for b in broken_links(page, root=tmp_path)]
    assert targets == ["gone.md", "other.md#nope"]


def _leaf_verbs() -> list[str]:
    """``logstore`` verbs as typed (``topics create``), plugins (``jobs ...``) included."""
    ctx = click.Context(cli_main)
    verbs: list[str] = []

    def walk(command: click.Command, prefix: list[str]) -> None:
        if isinstance(command, PluginCommand):  # loaded on first use: `logstore jobs`
            command = command.load()
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, [*prefix, name])
        else:
            verbs.append(" ".join(prefix))

    walk(cli_main, [])
    return verbs


def test_every_cli_verb_has_an_example() -> None:
    """An ``sh`` block on some page uses each verb, and docs/cli.md's table lists it.

    A ``no-run`` block counts: test_readme.py lists each with the test that runs its commands.
    """
    verbs = _leaf_verbs()
    assert {"topics create", "jobs compact", "dev cluster"} <= set(verbs), verbs
    shell = [b for b in load_pages() if b.language == "sh"]
    table = (REPO / "docs" / "cli.md").read_text().split("## Every verb", 1)[1]
    for verb in verbs:
        used = re.compile(rf"(^|[\s|;(]){re.escape('logstore ' + verb)}\b", re.MULTILINE)
        assert any(used.search(b.source) for b in shell), f"no example of `logstore {verb}`"
        assert f"`{verb}`" in table, f"`{verb}` has no row in docs/cli.md's Every verb"


def test_architecture_points_to_the_import_contracts() -> None:
    """One map: docs/architecture.md names every root package and links to ``.importlinter``."""
    text = (REPO / "docs" / "architecture.md").read_text()
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    roots = config["importlinter"]["root_packages"].split()
    assert roots
    table = [line for line in text.splitlines() if line.startswith("| ")]
    for package in roots:
        assert any(f"`{package}/`" in line for line in table), f"{package} is not in the table"
    assert "](../.importlinter)" in text
    assert table[0] == "| package | owns |", "the table repeats the contracts of .importlinter"
