"""Command groups that other packages add to ``logstore`` through entry points.

A package registers a click command or group under the ``logstore.cli``
entry-point group, e.g. in its ``pyproject.toml``::

    [project.entry-points."logstore.cli"]
    jobs = "jobs.cli:jobs"

and ``logstore jobs ...`` runs it. Plugins are loaded lazily, when their
command is used, so ``logstore`` never imports Spark (or anything a plugin
needs) for its own verbs, and a plugin that fails to import breaks only its
own command: using it prints one line, ``error: [PLUGIN_LOAD_FAILED] ...``,
and exits 1. ``logstore --help`` lists a plugin with its function's docstring,
read from the module's source (nothing is imported). Built-in commands win over a plugin of the same name; of
several plugins with one name, the first found is used.

Thread-safety: meant for the CLI's main thread.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from importlib import metadata
from typing import Any

import click

from logstore.cli.common import CliError

__all__ = ["ENTRY_POINT_GROUP", "PluginCommand", "add_plugin_commands"]

ENTRY_POINT_GROUP = "logstore.cli"


class PluginCommand(click.Command):
    """Stands for a plugin's command and loads it when used; all arguments go to it."""

    def __init__(self, entry_point: metadata.EntryPoint) -> None:
        described = _docstring_of(entry_point.value)
        super().__init__(
            entry_point.name,
            short_help=described or f"Commands from {entry_point.value} (plugin).",
            help=described or f"Commands from the plugin {entry_point.value}.",
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                              "help_option_names": []},
            add_help_option=False,
        )
        self.params = [click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)]
        self.entry_point = entry_point
        self._target: click.Command | None = None

    def load(self) -> click.Command:
        """The plugin's click command; raises :class:`CliError` when it cannot be loaded."""
        if self._target is not None:
            return self._target
        ep = self.entry_point
        try:
            target = ep.load()
        except Exception as e:  # noqa: BLE001 - any import failure is reported as one line
            raise CliError(
                f"the '{ep.name}' commands are unavailable: plugin {ep.value} failed to load: "
                f"{type(e).__name__}: {e}",
                code="PLUGIN_LOAD_FAILED",
            ) from None
        if not isinstance(target, click.Command):
            raise CliError(
                f"the '{ep.name}' commands are unavailable: plugin {ep.value} is a "
                f"{type(target).__name__}, not a click command",
                code="PLUGIN_LOAD_FAILED",
            )
        self._target = target
        return target

    def invoke(self, ctx: click.Context) -> Any:
        target = self.load()
        args = list(ctx.params.get("args") or ())
        with target.make_context(self.name, args, parent=ctx.parent) as sub:
            return target.invoke(sub)


def _docstring_of(value: str) -> str | None:
    """The docstring of the function an entry point names (``module:function``), read from the
    module's source without importing it (``logstore --help`` imports no plugin); None when
    it cannot be read."""
    module, _, attr = value.partition(":")
    top, *rest = module.strip().split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: found, not imported
        if spec is None:
            return None
        if rest:  # a submodule: its file under the package's folders (importing it would run the package)
            files = [os.path.join(folder, *rest) for folder in spec.submodule_search_locations or ()]
            path = next((f for f in (*(f + ".py" for f in files), *(os.path.join(f, "__init__.py") for f in files))
                         if os.path.isfile(f)), None)
        else:
            path = spec.origin
        if path is None or not path.endswith(".py"):
            return None
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read())
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr.strip():
            return ast.get_docstring(node)
    return None


def _entry_points() -> list[metadata.EntryPoint]:
    try:
        return list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # noqa: BLE001 - broken package metadata must not break the CLI
        return []


def add_plugin_commands(group: click.Group) -> list[str]:
    """Add a :class:`PluginCommand` to ``group`` for every ``logstore.cli`` entry point
    whose name is not taken; return the names added."""
    added: list[str] = []
    for ep in _entry_points():
        if ep.name in group.commands:
            continue
        group.add_command(PluginCommand(ep), ep.name)
        added.append(ep.name)
    return added
