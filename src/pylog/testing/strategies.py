"""Hypothesis strategies for pylog workloads: :func:`records`, :func:`topic_configs` and :func:`workloads`.

This is the only module of :mod:`pylog.testing` that needs Hypothesis (the ``testing`` extra: ``pip install
'pylog[testing]'``). :mod:`pylog.testing` imports it only when one of these names is first used, so the
rest of the package works without Hypothesis; without it, importing this module raises
:class:`ModuleNotFoundError` saying what to install. The strategies are built fresh on each call and hold
no state of their own.
"""

from __future__ import annotations

from typing import Any

from pylog.config import TopicConfig
from pylog.testing.batches import Record
from pylog.testing.model import AdvanceClock, Append, ApplyRetention, Flush, Roll, Step, TruncateTo

try:
    from hypothesis import strategies as st
    from hypothesis.strategies import SearchStrategy
except ImportError as exc:  # the ``testing`` extra is not installed
    raise ModuleNotFoundError(
        "pylog.testing's strategies need Hypothesis: pip install 'pylog[testing]'", name="hypothesis"
    ) from exc

__all__ = ["records", "topic_configs", "workloads"]


def records(
    *, max_key: int = 16, max_value: int = 64, min_ts: int = 0, max_ts: int = 1_700_000_000_000
) -> SearchStrategy[Record]:
    """A record: an optional key, a value (None only when there is a key), up to two headers, a timestamp.

    Timestamps default to ``0 .. 1_700_000_000_000`` (:class:`~pylog.clock.ManualClock`'s default start):
    never ahead of a log's clock, which refuses records more than ``message_timestamp_after_max_ms`` (1 hour)
    ahead of it."""

    @st.composite
    def draw_record(draw: st.DrawFn) -> Record:
        key = draw(st.none() | st.binary(max_size=max_key))
        value = draw(
            st.binary(max_size=max_value) if key is None else st.none() | st.binary(max_size=max_value)
        )
        headers = draw(
            st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=2).map(tuple)
        )
        ts = draw(st.integers(min_value=min_ts, max_value=max_ts))
        return (key, value, headers, ts)

    return draw_record()


def topic_configs(**fixed: Any) -> SearchStrategy[TopicConfig]:
    """Topic configs sized for tests: segments of 256 B - 4 KiB (so rolls happen), dense indexes, optional
    time/size retention, flush policies and LogAppendTime. ``fixed`` overrides any field."""
    fields: dict[str, SearchStrategy[Any]] = {
        "segment_bytes": st.integers(256, 4096),
        "index_interval_bytes": st.sampled_from([0, 64, 256, 4096]),
        "retention_ms": st.sampled_from([-1, 1_000, 60_000]),
        "retention_bytes": st.sampled_from([-1, -1, 2048, 8192]),
        "flush_messages": st.sampled_from([-1, -1, 1, 5]),
        "message_timestamp_type": st.sampled_from(["CreateTime", "CreateTime", "LogAppendTime"]),
        "compression_type": st.sampled_from(["none", "none", "zstd", "lz4", "gzip"]),
    }
    for name, value in fixed.items():
        fields[name] = st.just(value)
    return st.fixed_dictionaries(fields).map(lambda d: TopicConfig().replace(**d))


def workloads(
    partitions: int = 1,
    *,
    max_steps: int = 30,
    max_batch: int = 4,
    truncate: bool = True,
    start_ms: int = 1_700_000_000_000,
) -> SearchStrategy[list[Step]]:
    """Lists of steps for a topic with ``partitions`` partitions. Record timestamps stay near ``start_ms`` so
    retention and time lookups have something to do."""
    part = st.integers(0, partitions - 1)
    rec = records(min_ts=start_ms - 5_000, max_ts=start_ms + 120_000)
    choices: list[SearchStrategy[Step]] = [
        st.builds(Append, part, st.lists(rec, min_size=1, max_size=max_batch).map(tuple)),
        st.builds(Append, part, st.lists(rec, min_size=1, max_size=max_batch).map(tuple)),
        st.builds(Flush, part),
        st.builds(Roll, part),
        st.builds(AdvanceClock, st.integers(0, 30_000)),
        st.just(ApplyRetention()),
    ]
    if truncate:
        choices.append(st.builds(TruncateTo, part, st.floats(0.0, 1.0)))
    return st.lists(st.one_of(choices), max_size=max_steps)
