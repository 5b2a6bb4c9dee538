"""The ``logstore`` command: one click group, ``main``, with a verb per subcommand.

Verbs live in their own modules and are registered here, in the order
``logstore --help`` lists them:

* ``broker``        run a broker (:mod:`logstore.cli_broker`);
* ``topics``        create, list, describe, alter and delete topics (:mod:`logstore.cli_topics`);
* ``produce``, ``consume``, ``offsets``   records in and out (:mod:`logstore.cli_data`);
* ``groups``        list, describe (lag), reset offsets of and delete consumer groups (:mod:`logstore.cli_groups`);
* ``dump-segment``  what a segment file holds (:mod:`logstore.cli_segment`).

Packages add more through the ``logstore.cli`` entry-point group
(:mod:`logstore.cli_plugins`). A new verb is a click command in its own
module, decorated with :func:`logstore.cli_common.cli_errors` so that a
:class:`~logstore.errors.LogstoreError` or :class:`OSError` becomes one line
on stderr, ``error: [CODE] message``, and exit code 1 (never a traceback),
and added to ``_VERBS`` below.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import click

from logstore.cli_broker import broker
from logstore.cli_data import consume, offsets, produce
from logstore.cli_groups import groups
from logstore.cli_plugins import add_plugin_commands
from logstore.cli_segment import dump_segment
from logstore.cli_topics import topics

__all__ = ["main"]

_VERBS: tuple[click.Command, ...] = (broker, topics, produce, consume, offsets, groups, dump_segment)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logstore", prog_name="logstore")
def main() -> None:
    """logstore: a partitioned, replicated, append-only log of Arrow IPC segments."""


for _verb in _VERBS:
    main.add_command(_verb)
add_plugin_commands(main)
