"""Consumer groups: membership, generations, committed offsets and partition assignment.

* :mod:`pylog.groups.store`: the group's files (state, committed offsets, liveness locks) and their format;
* :mod:`pylog.groups.replica`: the ``groups_dir`` holding them for a log read from an object store;
* :mod:`pylog.groups.liveness`: the memory-mapped heartbeat table (a slot per member, the state's version);
* :mod:`pylog.groups.ticker`: one heartbeat thread per group and process;
* :mod:`pylog.groups.coordinator`: the group protocol, as functions over the shared state;
* :mod:`pylog.groups.member`: a consumer's membership (heartbeats, rebalances, commits);
* :mod:`pylog.groups.assignors`: ``range``, ``roundrobin``, ``sticky``, ``cooperative-sticky``;
* :mod:`pylog.groups.admin`: list, describe, lag, reset, delete;
* :mod:`pylog.groups.listener`: :class:`ConsumerRebalanceListener`.
"""

from pylog.groups.listener import ConsumerRebalanceListener

__all__ = ["ConsumerRebalanceListener"]
