"""Tiered storage: a log's sealed segments copied to an object store, and a log directory restored from it.

- :mod:`pylog.tiered.store`: :class:`ObjectStore`, the object-store client (obstore) behind one small API.
- :mod:`pylog.tiered.manifest`: the remote manifest of a partition, immutable versions written create-if-absent.
- :mod:`pylog.tiered.uploader`: copies sealed segments and their indexes, verifies them, publishes a manifest.
- :mod:`pylog.tiered.decisions`: the transaction decisions in the object store (read_committed readers of the
  store and restored logs need them), uploaded by every pass.
- :mod:`pylog.tiered.restore`: rebuilds a writable log directory from the object store, its transaction
  decisions included.
- :mod:`pylog.tiered.fetch`: reads of remote segments (the source a tiered partition reads below its local
  log start, or a log opened read-only from the object store reads entirely), a bounded block cache, prefetch.

See ``docs/tiered-storage.md`` for what this phase does and does not do.
"""
