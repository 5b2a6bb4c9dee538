"""Storage: segments, indexes, the partition log and everything that survives a restart."""
