"""The ``logstore`` command: one click group, ``main``, with a verb per subcommand.

Verbs live in their own modules and are registered here, in the order
``logstore --help`` lists them:

* ``broker``        run a broker (:mod:`logstore.cli.broker`);
* ``topics``        create, list, describe, alter and delete topics (:mod:`logstore.cli.topics`);
* ``produce``       append records read from stdin (:mod:`logstore.cli.produce`, input formats in
  :mod:`logstore.cli.produce_input`);
* ``consume``       print records as they arrive (:mod:`logstore.cli.consume`);
* ``offsets``       the positions of a topic's partitions (:mod:`logstore.cli.offsets`);
* ``groups``        list, describe (lag), reset offsets of and delete consumer groups (:mod:`logstore.cli.groups`);
* ``acls``          create, list and delete ACLs (:mod:`logstore.cli.acls`);
* ``dump-segment``  what a segment file holds (:mod:`logstore.cli.segment`);
* ``partitions``    move partitions between brokers, repair an offline one (:mod:`logstore.cli.partitions`);
* ``leaders``       preferred (or unclean) leader election (:mod:`logstore.cli.leaders`);
* ``cluster``       brokers, controller, under-replicated and offline partitions (:mod:`logstore.cli.cluster`);
* ``console``       a web console: brokers, topics, messages, groups with lag charts, jobs
  (:mod:`logstore.cli.console`);
* ``users``         create, delete and list SCRAM users (:mod:`logstore.cli.users`);
* ``dev``           a local cluster of etcd and brokers to try replication (:mod:`logstore.cli.dev`).

Packages add more through the ``logstore.cli`` entry-point group
(:mod:`logstore.cli.plugins`). A new verb is a click command in its own
module, decorated with :func:`logstore.cli.common.cli_errors` so that a
:class:`~logstore.errors.LogstoreError` or :class:`OSError` becomes one line
on stderr, ``error: [CODE] message``, and exit code 1 (never a traceback),
and added to ``_VERBS`` below.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import click

from logstore.cli.acls import acls
from logstore.cli.broker import broker
from logstore.cli.cluster import cluster
from logstore.cli.console import console
from logstore.cli.consume import consume
from logstore.cli.dev import dev
from logstore.cli.groups import groups
from logstore.cli.leaders import leaders
from logstore.cli.offsets import offsets
from logstore.cli.partitions import partitions
from logstore.cli.plugins import add_plugin_commands
from logstore.cli.produce import produce
from logstore.cli.segment import dump_segment
from logstore.cli.topics import topics
from logstore.cli.users import users

__all__ = ["main"]

_VERBS: tuple[click.Command, ...] = (broker, topics, produce, consume, offsets, groups, acls, dump_segment,
                                     partitions, leaders, cluster, console, users, dev)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logstore", prog_name="logstore")
def main() -> None:
    """logstore: a partitioned, replicated, append-only log of Arrow IPC segments."""


for _verb in _VERBS:
    main.add_command(_verb)
add_plugin_commands(main)
