"""Where the jobs' Spark runs: ``--master`` and the executor options of ``spark-submit``.

The ``logstore jobs`` verbs and ``python -m jobs.demo`` start their own
SparkSession (:func:`jobs.spark_session.local_session`) instead of being
launched by ``spark-submit``, so they take the options a Spark user would give
``spark-submit`` for a standalone cluster, with the same names and meaning:

* ``--master`` — ``local[2]`` (default), ``local[N]``, ``spark://HOST:7077``, ...;
* ``--executor-memory`` → ``spark.executor.memory`` (e.g. ``2g``);
* ``--executor-cores`` → ``spark.executor.cores``;
* ``--total-executor-cores`` → ``spark.cores.max`` (standalone: cores of the
  whole application, across workers);
* ``--conf KEY=VALUE`` (repeatable) — any other Spark setting, e.g.
  ``--conf spark.driver.host=10.0.0.5``; given last, so it wins over the above.

:func:`spark_conf` turns them into the ``conf`` mapping ``local_session`` takes.
Thread-safety: pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import click

__all__ = ["DEFAULT_MASTER", "parse_conf_items", "spark_conf", "spark_options"]

DEFAULT_MASTER = "local[2]"

F = TypeVar("F", bound=Callable[..., Any])


def parse_conf_items(items: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a malformed item is a :class:`click.BadParameter`."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--conf")
        out[key.strip()] = value.strip()
    return out


def _conf_callback(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict[str, str]:
    return parse_conf_items(values)


def spark_options(*, master_default: str | None = DEFAULT_MASTER) -> Callable[[F], F]:
    """Click options ``--master``, ``--executor-memory``, ``--executor-cores``,
    ``--total-executor-cores`` and ``--conf`` (keyword arguments ``master``,
    ``executor_memory``, ``executor_cores``, ``total_executor_cores``, ``spark_conf``).
    ``master_default`` None: ``--master`` is optional (the scheduler's config names one)."""

    def decorate(fn: F) -> F:
        options = [
            click.option("--master", default=master_default, show_default=master_default is not None,
                         help="Spark master: local[N], or spark://HOST:7077 for a standalone cluster."),
            click.option("--executor-memory", default=None, metavar="MEM",
                         help="Memory per executor, e.g. 2g (spark.executor.memory)."),
            click.option("--executor-cores", type=click.IntRange(min=1), default=None,
                         help="Cores per executor (spark.executor.cores)."),
            click.option("--total-executor-cores", type=click.IntRange(min=1), default=None,
                         help="Cores of the whole application on a standalone cluster (spark.cores.max)."),
            click.option("--conf", "spark_conf", multiple=True, callback=_conf_callback, metavar="KEY=VALUE",
                         help="A Spark setting (repeatable), e.g. spark.driver.host=10.0.0.5."),
        ]
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def spark_conf(*, executor_memory: str | None = None, executor_cores: int | None = None,
               total_executor_cores: int | None = None,
               conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark settings the options name (``--conf`` last: it wins)."""
    out: dict[str, str] = {}
    if executor_memory is not None:
        out["spark.executor.memory"] = executor_memory
    if executor_cores is not None:
        out["spark.executor.cores"] = str(executor_cores)
    if total_executor_cores is not None:
        out["spark.cores.max"] = str(total_executor_cores)
    out.update(conf or {})
    return out
