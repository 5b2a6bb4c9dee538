"""The producer: :class:`Producer` and the collaborators it wires (Kafka's split).

=============================  ==================================================
module                         owns
=============================  ==================================================
``producer``                   :class:`Producer`: the public API, options, checks
``accumulator``                per-partition queues, linger, pipelining window, memory bound
``record_buffer``              ``send()`` records column-wise per topic, split when sealed
``batch``                      a sealed batch; a partition's send state
``sender``                     the sender thread: requests in flight, retries, answers
``transaction_manager``        producer id and epoch, init/begin/commit/abort
``metadata``                   the cache of what the producer knows of a topic
``arrow_input``                input (Arrow, pandas, Python values) as the stored schema
``delivery``                   ``send()``'s light futures, callbacks, batch completions
=============================  ==================================================

The semantics are specified in :mod:`logstore.client.producer.producer`.
"""

from logstore.client.producer.arrow_input import to_stored_batch
from logstore.client.producer.delivery import DeliveryCallback
from logstore.client.producer.producer import Producer, parse_acks

__all__ = ["Producer", "DeliveryCallback", "parse_acks", "to_stored_batch"]
