"""How a cluster broker reaches the others and etcd: its links to partition leaders and the
etcd client's credentials, both from the broker's config.

The broker's assembly (:class:`logstore.broker.service.Broker`) builds these and hands them to
its :class:`~logstore.broker.membership.ClusterMembership`, which knows nothing of TLS or SASL:

* :func:`leader_links` — a follower's :class:`~replication.links.LeaderLink` to a leader, over
  TLS when this broker's listener is TLS (:func:`peer_credentials`: the peers' CA, this
  broker's certificate as the client's), logged in as the inter-broker SCRAM user when the
  listeners want SASL (:func:`peer_session`); the transaction part's channels to other
  brokers are made the same way;
* :func:`etcd_credentials` — TLS to etcd when ``etcd_ca`` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from logstore.broker.config import BrokerConfig
from logstore.broker.security.tls import client_credentials

if TYPE_CHECKING:
    import grpc

    from replication.link_auth import LinkSession
    from replication.links import LeaderLink
    from replication.state import BrokerRegistration

__all__ = ["leader_links", "peer_session", "peer_credentials", "etcd_credentials"]


def leader_links(config: BrokerConfig) -> Callable[[BrokerRegistration], LeaderLink]:
    """A factory of links to a partition's leader (see the module docstring)."""

    def link_for(broker: BrokerRegistration) -> LeaderLink:
        from replication.links import (
            GrpcLeaderLink,  # a single broker never loads replication's links
        )

        address = config.peer_address_overrides().get(broker.node_id, broker.address)
        return GrpcLeaderLink(address, session=peer_session(config), credentials=peer_credentials(config))

    return link_for


def peer_session(config: BrokerConfig) -> LinkSession | None:
    """A SCRAM session of the inter-broker user when the peers' listeners want SASL, else None."""
    if not config.sasl:
        return None
    from replication.link_auth import LinkCredentials, LinkSession

    return LinkSession(LinkCredentials(config.sasl_inter_broker_mechanism, config.sasl_inter_broker_username,
                                       config.sasl_inter_broker_password))


def peer_credentials(config: BrokerConfig) -> grpc.ChannelCredentials | None:
    """TLS to a peer when this broker's listener is TLS (the peers' CA, this broker's certificate
    as the client's), else None (plaintext)."""
    return client_credentials(config.peer_ca, config.tls_cert, config.tls_key) if config.tls else None


def etcd_credentials(config: BrokerConfig) -> grpc.ChannelCredentials | None:
    """TLS for the etcd client when ``etcd_ca`` is set, else None (plaintext)."""
    return client_credentials(config.etcd_ca, config.etcd_cert, config.etcd_key) if config.etcd_ca else None
