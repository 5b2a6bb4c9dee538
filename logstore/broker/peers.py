"""How a cluster broker reaches the others and etcd: its links to partition leaders and the
etcd client's credentials, both from the broker's config.

The broker's assembly (:class:`logstore.broker.service.Broker`) builds these and hands them to
its :class:`~logstore.broker.membership.ClusterMembership`, which knows nothing of TLS or SASL:

* :func:`leader_links` — a follower's :class:`~replication.links.LeaderLink` to a leader, over
  TLS when this broker's listener is TLS (the peers' CA, this broker's certificate as the
  client's), logged in as the inter-broker SCRAM user when the listeners want SASL;
* :func:`etcd_credentials` — TLS to etcd when ``etcd_ca`` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from logstore.broker.config import BrokerConfig
from logstore.broker.security.tls import client_credentials

if TYPE_CHECKING:
    import grpc

    from replication.links import LeaderLink
    from replication.state import BrokerRegistration

__all__ = ["leader_links", "etcd_credentials"]


def leader_links(config: BrokerConfig) -> Callable[[BrokerRegistration], LeaderLink]:
    """A factory of links to a partition's leader (see the module docstring)."""

    def link_for(broker: BrokerRegistration) -> LeaderLink:
        from replication.links import (
            GrpcLeaderLink,  # a single broker never loads replication's links
        )

        address = config.peer_address_overrides().get(broker.node_id, broker.address)
        session = None
        if config.sasl:  # the leader's listener wants a SCRAM session: log in as the inter-broker user
            from replication.link_auth import LinkCredentials, LinkSession

            session = LinkSession(LinkCredentials(config.sasl_inter_broker_mechanism,
                                                  config.sasl_inter_broker_username,
                                                  config.sasl_inter_broker_password))
        credentials = client_credentials(config.peer_ca, config.tls_cert, config.tls_key) if config.tls else None
        return GrpcLeaderLink(address, session=session, credentials=credentials)

    return link_for


def etcd_credentials(config: BrokerConfig) -> grpc.ChannelCredentials | None:
    """TLS for the etcd client when ``etcd_ca`` is set, else None (plaintext)."""
    return client_credentials(config.etcd_ca, config.etcd_cert, config.etcd_key) if config.etcd_ca else None
