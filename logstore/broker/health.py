"""The standard gRPC health service (``grpc.health.v1.Health``) on the broker's port.

What it answers, for the service names ``""`` (the server) and ``logstore.v1.Logstore``:

* ``SERVING`` once :meth:`Broker.start <logstore.broker.service.Broker.start>` has
  recovered the logs, bound and (on a cluster) joined it and applied the first
  cluster view: a load balancer or Kubernetes probe (``grpc_health_probe``) may
  send clients from then on;
* ``NOT_SERVING`` from the moment the broker begins to stop (before the controlled
  shutdown moves its leaderships), so a probe sees the broker leave before its
  port closes.

This is grpcio-health-checking's asyncio servicer; ``Watch`` streams the changes.

Thread-safety: call :meth:`BrokerHealth.serving` and :meth:`BrokerHealth.stopping`
on the broker's event loop.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

__all__ = ["BrokerHealth", "SERVICE_NAMES"]

SERVICE_NAMES = ("", "logstore.v1.Logstore")


class BrokerHealth:
    """The health servicer of one broker: create it, then :meth:`set_serving` as the broker moves."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._servicer = HealthServicer()  # says SERVING for "" until told otherwise
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)

    async def set_serving(self, serving: bool) -> None:
        """SERVING or NOT_SERVING for every name in :data:`SERVICE_NAMES`."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in SERVICE_NAMES:
            await self._servicer.set(name, status)
