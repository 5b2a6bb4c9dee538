"""Kafka's wire protocol beside gRPC: a second front end on the broker's data plane.

* :mod:`.listener` — the TCP listener: framing, headers, one request at a time per connection;
* :mod:`.security` — the listener's security protocol: TLS, client certificates, SASL (the
  broker's ``security_protocol`` and TLS keys); :mod:`.sasl` — SaslHandshake and
  SaslAuthenticate (SCRAM) per connection; :mod:`.request_context` — the principal each
  request is handled for (every API checks the authorizer, as Kafka's do);
  :mod:`.throttling` — client quotas (throttle time, then the connection muted);
* :mod:`.apis` — the APIs served (ApiVersions, Metadata, Produce, Fetch, ListOffsets) and
  their versions, answered from the data plane and the log manager;
* :mod:`.txn_apis` — producer ids and transactions (InitProducerId, AddPartitionsToTxn, EndTxn)
  through the transaction coordinator;
* :mod:`.group_apis` — consumer groups (FindCoordinator, OffsetCommit, OffsetFetch,
  ConsumerGroupHeartbeat: Kafka's new group protocol) through
  the group coordinator;
* :mod:`.admin_apis` — topics, configs, records and the cluster (CreateTopics, DeleteTopics,
  CreatePartitions, DescribeConfigs, IncrementalAlterConfigs, DeleteRecords, DescribeCluster);
* :mod:`.acl_apis` — the ACLs' admin APIs (DescribeAcls, CreateAcls, DeleteAcls);
* :mod:`.group_admin_apis` — listing, describing and deleting groups (ListGroups,
  DescribeGroups, DeleteGroups);
* :mod:`.classic_group_apis` — the classic group protocol (JoinGroup, SyncGroup, Heartbeat,
  LeaveGroup) bridged onto the same coordinator;
* :mod:`.cluster` — the cluster as Kafka clients see it: brokers at their Kafka listeners,
  partition leaders, replicas and ISR, the coordinator of a key (Metadata, DescribeCluster,
  FindCoordinator);
* :mod:`.messages` — building a response for any version of its API;
* :mod:`.record_batch` — Kafka's RecordBatch v2 to and from logstore's stored batches;
* :mod:`.error_codes` — our errors as Kafka's numeric codes.

Messages are (de)serialized by kio (Kafka's own message schemas, generated), which needs
Python 3.11: the broker imports this package only when ``kafka_listener`` is set, and the
config refuses that setting on Python 3.10 (:mod:`logstore.broker.config`).
"""

from logstore.broker.kafka.acl_apis import KafkaAclApis
from logstore.broker.kafka.admin_apis import KafkaAdminApis
from logstore.broker.kafka.apis import SUPPORTED, KafkaApis
from logstore.broker.kafka.classic_group_apis import KafkaClassicGroupApis
from logstore.broker.kafka.cluster import KafkaCluster
from logstore.broker.kafka.group_admin_apis import KafkaGroupAdminApis
from logstore.broker.kafka.group_apis import KafkaGroupApis
from logstore.broker.kafka.listener import KafkaListener
from logstore.broker.kafka.request_context import RequestContext
from logstore.broker.kafka.sasl import SASL_APIS
from logstore.broker.kafka.security import ListenerSecurity
from logstore.broker.kafka.throttling import KafkaThrottling
from logstore.broker.kafka.txn_apis import KafkaTxnApis

__all__ = ["KafkaAclApis", "KafkaAdminApis", "KafkaApis", "KafkaClassicGroupApis", "KafkaCluster", "KafkaGroupAdminApis",
           "KafkaGroupApis", "KafkaListener", "KafkaThrottling", "KafkaTxnApis", "ListenerSecurity",
           "RequestContext", "SASL_APIS", "SUPPORTED"]
