"""The broker's data plane: appends and reads, for every front end (see :mod:`.plane`)."""

from logstore.broker.data_plane.params import (
    FetchParams,
    FetchPartition,
    Isolation,
    PartitionAppend,
    PartitionRead,
)
from logstore.broker.data_plane.plane import DataPlane

__all__ = ["DataPlane", "FetchParams", "FetchPartition", "Isolation", "PartitionAppend", "PartitionRead"]
