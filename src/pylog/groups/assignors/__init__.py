"""Partition assignors: who in a consumer group reads which partitions.

Each assignor is a pure, deterministic function (no I/O, no state) with Kafka's name and behaviour:

======================  ===========  =========================================================================
name                    protocol     strategy
======================  ===========  =========================================================================
``range``               eager        per topic, contiguous ranges over the sorted subscribers (Kafka default)
``roundrobin``          eager        all partitions dealt in a circle, skipping members not subscribed
``sticky``              eager        balanced, and keeps owned partitions wherever balance allows
``cooperative-sticky``  cooperative  sticky, but a partition changes owner over two rebalances (KIP-429)
======================  ===========  =========================================================================

pylog's default is ``cooperative-sticky`` (:data:`DEFAULT_ASSIGNOR`): members keep consuming through
a rebalance.

>>> get_assignor("range")
RangeAssignor()
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from pylog.errors import ConfigError
from pylog.groups.assignors.base import Assignment, Assignor, Subscription, format_assignment
from pylog.groups.assignors.cooperative_sticky import CooperativeStickyAssignor
from pylog.groups.assignors.range import RangeAssignor
from pylog.groups.assignors.roundrobin import RoundRobinAssignor
from pylog.groups.assignors.sticky import StickyAssignor

__all__ = [
    "ASSIGNORS",
    "DEFAULT_ASSIGNOR",
    "Assignment",
    "Assignor",
    "CooperativeStickyAssignor",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    "Subscription",
    "format_assignment",
    "get_assignor",
]

#: Strategy name (Kafka's ``partition.assignment.strategy`` values) -> assignor class.
ASSIGNORS: Final[Mapping[str, type[Assignor]]] = MappingProxyType(
    {cls.name: cls for cls in (RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor)}
)

#: The strategy a consumer group uses unless told otherwise.
DEFAULT_ASSIGNOR: Final = "cooperative-sticky"


def get_assignor(name: str) -> Assignor:
    """A new assignor for a strategy name; :class:`~pylog.errors.ConfigError` lists the known names if not."""
    try:
        cls = ASSIGNORS[name]
    except KeyError as exc:
        known = ", ".join(sorted(ASSIGNORS))
        raise ConfigError(f"unknown partition assignment strategy {name!r}; known: {known}") from exc
    return cls()
