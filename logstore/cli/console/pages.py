"""The console's pages: one aiohttp handler each, rendering what the admin client reports.

==========================================  =================================================
``/``                                       brokers, controller, offline and under-replicated
                                            partitions (the cluster, or a cluster of one)
``/topics``                                 every topic: kind, partitions, replicas, size, rate
``/topics/{name}``                          partitions: leader, replicas, ISR, size, log start,
                                            end (HWM), LSO, LEO, records/s
``/topics/{name}/messages``                 the message browser (:mod:`.browse`)
``/groups``                                 every group: state, members, total lag
``/groups/{id}``                            members, assignment, committed offsets, lag per
                                            partition and the lag-over-time chart
``/jobs``                                   the scheduler's last runs (:mod:`.jobs_status`)
==========================================  =================================================

Every admin call blocks, so it runs in a worker thread (``asyncio.to_thread``).
Offsets (log start, HWM, LSO) and lag are the partition leaders' (:mod:`.offsets`).
A :class:`~logstore.errors.LogstoreError` becomes a page with one line, the
error's code and message: 404 for an unknown topic or group, 502 otherwise.

A partition is **offline** when its leader is not a live broker and
**under-replicated** when its ISR is smaller than its replicas (as
``logstore cluster describe``).

Thread-safety: handlers run on the console's event loop.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from logstore.cli.console import browse
from logstore.cli.console.html import (
    Markup,
    esc,
    fmt_bytes,
    fmt_rate,
    line_chart,
    link,
    page,
    quote,
    table,
    url,
)
from logstore.cli.console.jobs_status import render_jobs
from logstore.cli.console.offsets import group_lag, with_leader_offsets
from logstore.cli.console.sampler import LagPoint, Sampler
from logstore.client.admin import Admin
from logstore.client.results import ClusterMetadata
from logstore.client.security import ClientSecurity
from logstore.errors import GroupIdNotFoundError, LogstoreError, UnknownTopicOrPartitionError
from logstore.schema_text import format_schema
from logstore.types import PartitionInfo, TopicDescription

__all__ = ["ConsoleState", "STATE", "render", "routes"]


@dataclass
class ConsoleState:
    """What the handlers share: the admin client, the sampler, and the console's options."""

    admin: Admin
    sampler: Sampler
    bootstrap: str
    jobs_status: Path | None = None
    refresh_s: float | None = 10.0
    security: ClientSecurity | None = None  # the clients' TLS/SASL (the message browser's consumer)


STATE: web.AppKey[ConsoleState] = web.AppKey("console_state", ConsoleState)
routes = web.RouteTableDef()


def _state(request: web.Request) -> ConsoleState:
    return request.app[STATE]


def render(state: ConsoleState, title: str, body: Markup, *, active: str, status: int = 200,
           refresh: bool = False) -> web.Response:
    """A whole HTML page (:func:`~logstore.cli.console.html.page`) as the answer."""
    text = page(title, body, active=active, bootstrap=state.bootstrap,
                refresh_s=state.refresh_s if refresh else None)
    return web.Response(text=str(text), status=status, content_type="text/html", charset="utf-8")


def _error(state: ConsoleState, e: LogstoreError, *, active: str) -> web.Response:
    status = 404 if isinstance(e, (UnknownTopicOrPartitionError, GroupIdNotFoundError)) else 502
    body = Markup(f'<p class=bad id=error>[{esc(e.code)}] {esc(e.message)}</p>')
    return render(state, "Not found" if status == 404 else "Broker error", body, active=active, status=status)


async def _call(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def _health(md: ClusterMetadata) -> tuple[list[PartitionInfo], list[PartitionInfo]]:
    """(offline, under-replicated) partitions of ``md``."""
    live = {b.node_id for b in md.brokers}
    offline, under = [], []
    for name in sorted(md.topics):
        for p in md.topics[name].partitions:
            if p.leader not in live:
                offline.append(p)
            elif len(p.isr) < len(p.replicas):
                under.append(p)
    return offline, under


def _cards(items: list[tuple[str, object, str]]) -> Markup:
    return Markup("<div class=cards>" + "".join(
        f'<div class=card id="card-{esc(key)}"><b class="{esc(cls)}">{esc(value)}</b>{esc(key.replace("-", " "))}'
        "</div>" for key, value, cls in items) + "</div>")


# --------------------------------------------------------------------------- cluster


@routes.get("/")
async def overview(request: web.Request) -> web.Response:
    state = _state(request)
    try:
        md: ClusterMetadata = await _call(state.admin.describe_cluster)
        groups = await _call(state.admin.list_groups)
    except LogstoreError as e:
        return _error(state, e, active="/")
    offline, under = _health(md)
    n_parts = sum(len(d.partitions) for d in md.topics.values())
    body = _cards([
        ("brokers", len(md.brokers), ""),
        # "node 0", not a bare "0" that reads as "no controller" on a single broker (node 0)
        ("controller", f"node {md.controller_id}" if md.controller_id >= 0 else None, ""),
        ("topics", len(md.topics), ""),
        ("partitions", n_parts, ""),
        ("offline-partitions", len(offline), "bad" if offline else "ok"),
        ("under-replicated", len(under), "bad" if under else "ok"),
        ("consumer-groups", len(groups), ""),
    ])
    body += Markup(f"<p>cluster <b>{esc(md.cluster_id)}</b>"
                   f"{' (a single broker)' if len(md.brokers) == 1 else ''}</p><h2>Brokers</h2>")
    body += table(("node", "address", "rack", "role"), (
        (b.node_id, f"{b.host}:{b.port}", b.rack or None, "controller" if b.node_id == md.controller_id else "")
        for b in sorted(md.brokers, key=lambda b: b.node_id)), numeric=("node",), table_id="brokers")
    for title, parts, ident in (("Offline partitions", offline, "offline"),
                                ("Under-replicated partitions", under, "under-replicated")):
        body += Markup(f"<h2>{title}: {len(parts)}</h2>")
        body += table(("topic", "partition", "leader", "replicas", "ISR"), (
            (link(f"/topics/{quote(p.topic)}", p.topic), p.partition, p.leader if p.leader >= 0 else None,
             ",".join(map(str, p.replicas)), ",".join(map(str, p.isr))) for p in parts),
            numeric=("partition",), table_id=ident)
    if state.sampler.last_error:
        body += Markup(f"<p class=bad>last sample failed: {esc(state.sampler.last_error)}</p>")
    return render(state, "Cluster", body, active="/", refresh=True)


# --------------------------------------------------------------------------- topics


def _topic_rate(state: ConsoleState, desc: TopicDescription) -> float | None:
    rates = [state.sampler.rate(p.topic_partition) for p in desc.partitions]
    known = [r for r in rates if r is not None]
    return sum(known) if known else None


@routes.get("/topics")
async def topics(request: web.Request) -> web.Response:
    state = _state(request)
    try:
        described = await _call(state.admin.describe_topics)
        found: dict[str, TopicDescription] = await _call(with_leader_offsets, state.admin, described)
    except LogstoreError as e:
        return _error(state, e, active="/topics")
    rows = []
    for name in sorted(found):
        d = found[name]
        rows.append((
            link(f"/topics/{quote(name)}", name),
            ("typed" if d.typed else "untyped") + (", internal" if name.startswith("__") else ""),
            d.num_partitions,
            max((len(p.replicas) for p in d.partitions), default=0),
            fmt_bytes(sum(p.size_bytes for p in d.partitions)),
            sum(p.high_watermark - p.log_start_offset for p in d.partitions),
            fmt_rate(_topic_rate(state, d)),
        ))
    body = table(("topic", "value", "partitions", "replicas", "size", "offsets (start→end)", "records/s"),
                 rows, numeric=("partitions", "replicas", "size", "offsets (start→end)", "records/s"),
                 table_id="topics", empty="no topics")
    body += Markup("<p class=muted>offsets (start→end): the high-water marks minus the log start offsets, "
                   "summed; a compacted topic holds fewer records. records/s: from the console's own "
                   f"samples every {state.sampler.interval_s:g}s.</p>")
    return render(state, "Topics", body, active="/topics", refresh=True)


@routes.get("/topics/{name}")
async def topic(request: web.Request) -> web.Response:
    state = _state(request)
    name = request.match_info["name"]
    try:
        desc = await _describe(state, name)
        configs: dict[str, str] = (await _call(state.admin.describe_configs, [name]))[name]
    except LogstoreError as e:
        return _error(state, e, active="/topics")
    rows = []
    for p in desc.partitions:
        rows.append((
            p.partition, p.leader if p.leader >= 0 else None, ",".join(map(str, p.replicas)),
            ",".join(map(str, p.isr)), fmt_bytes(p.size_bytes), p.log_start_offset, p.high_watermark,
            p.last_stable_offset, p.log_end_offset, fmt_rate(state.sampler.rate(p.topic_partition)),
            link(url(f"/topics/{quote(name)}/messages", partition=p.partition), "browse"),
        ))
    cols = ("partition", "leader", "replicas", "ISR", "size", "log start", "end (HWM)", "LSO", "LEO",
            "records/s", "messages")
    body = table(cols, rows, numeric=("partition", "leader", "size", "log start", "end (HWM)", "LSO", "LEO",
                                      "records/s"), table_id="partitions")
    body += Markup("<h2>Value schema</h2>")
    body += (Markup(f"<pre id=schema>{esc(format_schema(desc.value_schema))}</pre>") if desc.value_schema
             else Markup("<p id=schema>untyped: keys and values are bytes</p>"))
    body += Markup("<h2>Configuration</h2>")
    body += table(("key", "value"), sorted(configs.items()), table_id="configs")
    return render(state, f"Topic {name}", body, active="/topics", refresh=True)


async def _describe(state: ConsoleState, name: str) -> TopicDescription:
    """Topic ``name`` with its leaders' offsets (:mod:`.offsets`); raises for an unknown topic."""
    described = await _call(state.admin.describe_topics, [name])
    fixed: dict[str, TopicDescription] = await _call(with_leader_offsets, state.admin, described)
    return fixed[name]


def _int_param(request: web.Request, key: str, default: int | None, *, low: int = 0) -> int | None:
    raw = request.query.get(key, "")
    if raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"the query parameter {key} must be an integer") from None
    if value < low:
        raise web.HTTPBadRequest(text=f"the query parameter {key} must be >= {low}")
    return value


@routes.get("/topics/{name}/messages")
async def messages(request: web.Request) -> web.Response:
    state = _state(request)
    name = request.match_info["name"]
    partition = _int_param(request, "partition", 0)
    offset = _int_param(request, "offset", None)
    limit = min(_int_param(request, "limit", browse.DEFAULT_LIMIT, low=1) or 1, browse.MAX_LIMIT)
    try:
        desc = await _describe(state, name)
        if partition is None or partition >= desc.num_partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} has no partition {partition} (it has {desc.num_partitions})")
        info = desc.partitions[partition]
        window = await asyncio.to_thread(browse.read_window, state.bootstrap, info, offset, limit,
                                           state.security)
    except LogstoreError as e:
        return _error(state, e, active="/topics")
    base = f"/topics/{quote(name)}/messages"
    options = "".join(f'<option value="{p.partition}"{" selected" if p.partition == partition else ""}>'
                      f"{p.partition}</option>" for p in desc.partitions)
    body = Markup(
        f'<form class=inline method=get action="{esc(base)}">'
        f'<label>partition<select name=partition>{options}</select></label>'
        f'<label>offset<input name=offset type=number min=0 value="{esc(window.start)}"></label>'
        f'<label>limit<input name=limit type=number min=1 max={browse.MAX_LIMIT} value="{limit}"></label>'
        "<button>show</button></form>"
    )
    body += Markup(f"<p id=window>offsets {window.start} to {window.end} (exclusive) of "
                   f"{info.log_start_offset}…{info.last_stable_offset}; {len(window.records)} records "
                   f"({'typed: one column per value column' if desc.typed else 'untyped: key and value'})"
                   "</p>")
    nav = []
    if window.start > info.log_start_offset:
        nav.append(link(url(base, partition=partition, offset=max(info.log_start_offset, window.start - limit),
                            limit=limit), "← older"))
    if window.end < info.last_stable_offset:
        nav.append(link(url(base, partition=partition, offset=window.end, limit=limit), "newer →"))
    body += Markup("<p>" + " · ".join(nav) + "</p>")
    if desc.value_schema is not None:
        columns = list(desc.value_schema.names)
        body += table(["offset", "timestamp", "key", *columns, "headers"],
                      browse.typed_rows(window.records, columns), numeric=("offset",), table_id="messages",
                      empty="no records in this window")
    else:
        body += table(("offset", "timestamp", "key", "value", "headers"), browse.untyped_rows(window.records),
                      numeric=("offset",), table_id="messages", empty="no records in this window")
    return render(state, f"Messages of {name}-{partition}", body, active="/topics")


# --------------------------------------------------------------------------- groups


@routes.get("/groups")
async def groups(request: web.Request) -> web.Response:
    state = _state(request)
    try:
        found = await _call(state.admin.list_groups)
    except LogstoreError as e:
        return _error(state, e, active="/groups")
    rows = []
    for g in found:
        history = state.sampler.lag_history(g.group_id)
        rows.append((link(f"/groups/{quote(g.group_id)}", g.group_id), g.state, g.members, g.assignor,
                     history[-1].total if history else None))
    body = table(("group", "state", "members", "assignor", "total lag"), rows,
                 numeric=("members", "total lag"), table_id="groups", empty="no consumer groups")
    body += Markup(f"<p class=muted>total lag: from the console's last sample (every "
                   f"{state.sampler.interval_s:g}s).</p>")
    return render(state, "Consumer groups", body, active="/groups", refresh=True)


def _tps(tps: frozenset[Any]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(tps):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in by_topic.items()) or "-"


@routes.get("/groups/{group:.+}")  # a group id may hold any character, "/" too
async def group(request: web.Request) -> web.Response:
    state = _state(request)
    group_id = request.match_info["group"]
    try:
        desc, lag = await _call(group_lag, state.admin, group_id)
    except LogstoreError as e:
        return _error(state, e, active="/groups")
    total = sum(r.lag for r in lag if r.lag is not None)
    body = _cards([("state", desc.state, ""), ("members", len(desc.members), ""),
                   ("total-lag", total, ""), ("epoch", desc.group_epoch, "")])
    body += Markup(f"<p>assignor {esc(desc.assignor)}</p><h2>Lag over time</h2>")
    history = state.sampler.lag_history(group_id)
    # The chart ends with this page's own reading, so its legend ("now") says what the card says,
    # not the sampler's last point (up to one interval older).
    points = [*history, LagPoint(time.time(), total, {r.topic_partition: r.lag for r in lag if r.lag is not None})]
    series: dict[str, list[tuple[float, float]]] = {"total": [(p.at_s, float(p.total)) for p in points]}
    tps = sorted({tp for p in points for tp in p.partitions})
    if len(tps) <= 8:
        for tp in tps:
            series[f"{tp.topic}-{tp.partition}"] = [(p.at_s, float(p.partitions[tp])) for p in points
                                                   if tp in p.partitions]
    body += line_chart(series, y_label=f"lag of group {group_id}", chart_id="lag-chart")
    body += Markup(f"<p class=muted>{len(history)} samples, one every {state.sampler.interval_s:g}s "
                   f"(the console keeps the last {state.sampler.history}).</p><h2>Members</h2>")
    body += table(("member", "instance", "client", "host", "epoch", "topics", "assignment", "revoking"), (
        (m.member_id, m.instance_id or None, m.client_id or None, m.client_host or None,
         "left" if m.left else m.member_epoch, ",".join(m.subscribed_topics), _tps(m.assignment),
         _tps(m.pending_revocation) if m.pending_revocation else None) for m in desc.members),
        numeric=("epoch",), table_id="members", empty="no members")
    body += Markup("<h2>Offsets</h2>")
    body += table(("topic", "partition", "committed", "end (HWM)", "lag", "member"), (
        (link(f"/topics/{quote(r.topic)}", r.topic), r.partition, r.committed_offset,
         r.log_end_offset if r.log_end_offset >= 0 else None, r.lag, r.member_id) for r in lag),
        numeric=("partition", "committed", "end (HWM)", "lag"), table_id="offsets",
        empty="no committed offsets")
    return render(state, f"Group {group_id}", body, active="/groups", refresh=True)


# --------------------------------------------------------------------------- jobs


@routes.get("/jobs")
async def jobs(request: web.Request) -> web.Response:
    state = _state(request)
    body = await asyncio.to_thread(render_jobs, state.jobs_status)
    return render(state, "Jobs", body, active="/jobs", refresh=True)
