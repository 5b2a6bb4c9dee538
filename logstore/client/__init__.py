"""Clients of the broker: RPC client, producer, consumer, admin, group member, partitioner."""
