"""Consumer groups: membership, generations, committed offsets and partition assignment."""
