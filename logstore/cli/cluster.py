"""``logstore cluster describe``: the brokers, the controller, and the partitions that need care.

A partition is **under-replicated** when its ISR is smaller than its replica
list (a follower is down or behind), and **offline** when it has no live
leader (no in-sync replica is alive; with ``unclean.leader.election.enable``
false it waits for one to come back). A single broker is a cluster of one
whose partitions are never either.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

from typing import Any

import click

from logstore.cli.common import bootstrap_option, cli_errors, format_option, print_json, print_table
from logstore.cli_api.security_options import cli_security
from logstore.client.admin import Admin
from logstore.client.results import ClusterMetadata

__all__ = ["cluster"]


@click.group()
def cluster() -> None:
    """Describe the cluster: brokers, controller, under-replicated and offline partitions."""


def _doc(md: ClusterMetadata) -> dict[str, Any]:
    live = {b.node_id for b in md.brokers}
    under, offline = [], []
    for topic in sorted(md.topics):
        for p in md.topics[topic].partitions:
            entry = {"topic": topic, "partition": p.partition, "leader": p.leader,
                     "replicas": list(p.replicas), "isr": list(p.isr)}
            if p.leader not in live:
                offline.append(entry)
            elif len(p.isr) < len(p.replicas):
                under.append(entry)
    return {
        "cluster_id": md.cluster_id,
        "controller": md.controller_id,
        "brokers": [{"node_id": b.node_id, "address": f"{b.host}:{b.port}", "rack": b.rack or None}
                    for b in sorted(md.brokers, key=lambda b: b.node_id)],
        "under_replicated_partitions": under,
        "offline_partitions": offline,
    }


@cluster.command("describe")
@format_option()
@bootstrap_option
@cli_errors
def describe(output_format: str, bootstrap: str) -> None:
    """Show the brokers, the active controller and the partitions that are under-replicated or offline."""
    with Admin(bootstrap, security=cli_security()) as admin:
        doc = _doc(admin.describe_cluster())
    if output_format == "json":
        print_json(doc)
        return
    click.echo(f"cluster {doc['cluster_id']}: {len(doc['brokers'])} broker"
               f"{'s' if len(doc['brokers']) != 1 else ''}, controller {doc['controller']}")
    print_table("brokers", ("node", "address", "rack", "role"), (
        (b["node_id"], b["address"], b["rack"], "controller" if b["node_id"] == doc["controller"] else "")
        for b in doc["brokers"]), numeric=("node",))
    for key, title in (("under_replicated_partitions", "under-replicated partitions"),
                       ("offline_partitions", "offline partitions")):
        rows = doc[key]
        if not rows:
            click.echo(f"{title}: none")
            continue
        print_table(f"{title}: {len(rows)}", ("topic", "partition", "leader", "replicas", "isr"), (
            (r["topic"], r["partition"], r["leader"] if r["leader"] >= 0 else "none",
             ",".join(map(str, r["replicas"])), ",".join(map(str, r["isr"]))) for r in rows),
            numeric=("partition",))
