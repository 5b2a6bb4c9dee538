"""The package layout keeps its promises (docs/architecture.md, `.importlinter`, DESIGN.md section 4).

The import contracts themselves are checked by ``lint-imports`` in ``make lint``
(which ``make test`` runs first); these tests pin what a contract cannot see:
what an import actually loads at run time, and module size.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("logstore", "spark_source", "spark_sink", "compaction", "replication", "jobs")
# "No module over about 600 lines" (one concept per module); generated gRPC code aside.
MAX_MODULE_LINES = 650


def _loaded_after(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=REPO, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize("module", ["logstore.storage.log", "logstore.storage.log_manager",
                                    "logstore.record", "logstore.errors"])
def test_importing_storage_or_the_format_loads_no_grpc_and_no_client(module: str) -> None:
    loaded = _loaded_after(f"import {module}")
    assert module in loaded
    assert not {m for m in loaded if m == "grpc" or m.startswith("grpc.")}, module
    assert not {m for m in loaded if m.startswith(("logstore.client", "logstore.broker", "logstore.cli"))}


def test_the_public_api_resolves_lazily() -> None:
    loaded = _loaded_after("import logstore")
    assert "logstore.client.producer" not in loaded and "grpc" not in loaded
    loaded = _loaded_after("from logstore import TopicPartition")
    assert "logstore.types" in loaded and "logstore.client.producer" not in loaded
    loaded = _loaded_after("from logstore import Producer")
    assert "logstore.client.producer" in loaded


def test_no_module_is_over_about_600_lines() -> None:
    too_long = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "_proto" in path.parts:
                continue
            lines = len(path.read_text().splitlines())
            if lines > MAX_MODULE_LINES:
                too_long[str(path.relative_to(REPO))] = lines
    assert not too_long, f"split these by concept (at most {MAX_MODULE_LINES} lines): {too_long}"


# tests/ mirrors the packages; what several folders share lives in tests/support/.
TEST_FOLDERS = {"storage", "broker", "client", "replication", "spark", "jobs", "cli", "e2e", "chaos",
                "project"}


def test_every_test_module_lives_in_its_folder_and_imports_no_other_test_module() -> None:
    tests = REPO / "tests"
    test_modules = {p.stem for p in tests.rglob("test_*.py")}
    misplaced, shared = [], []
    for path in tests.rglob("*.py"):
        folder = path.relative_to(tests).parts[0]
        if path.name.startswith("test_") and folder not in TEST_FOLDERS:
            misplaced.append(str(path.relative_to(tests)))
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in test_modules or n.startswith("tests.") for n in names):
                shared.append(f"{path.relative_to(tests)} imports {names}")
    assert not misplaced, f"test modules outside {sorted(TEST_FOLDERS)}: {misplaced}"
    assert not shared, f"move what tests share into tests/support/: {shared}"
    assert not [p.name for p in (tests / "support").glob("test_*.py")], "tests/support/ holds no tests"


def test_only_the_assembly_and_the_membership_ask_whether_the_broker_is_clustered() -> None:
    # Single broker and cluster are two configurations of one graph: the assembly
    # (broker/service.py) chooses the parts' collaborators, and the membership answers where
    # partitions are led; no handler or part asks the configuration which one it is in.
    allowed = {"service.py", "membership.py", "config.py"}
    asking = [f"{path.relative_to(REPO)}:{i}" for path in (REPO / "logstore" / "broker").rglob("*.py")
              if path.name not in allowed
              for i, line in enumerate(path.read_text().splitlines(), 1)
              if "config.clustered" in line.split("#")[0]]
    assert not asking, asking
