"""A partition: an append-only, segmented, crash-safe log of record batches (see :class:`PartitionLog`)."""
