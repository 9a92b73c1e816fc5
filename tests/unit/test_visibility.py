"""The transaction visibility rule (pylog.partition.visibility) against a plain model of read_committed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.partition.visibility import (
    ABORTED,
    CONTROL,
    OPEN,
    VISIBLE,
    Committed,
    Visibility,
    is_skipped,
)
from pylog.record import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchHeader

STATUSES = ("committed", "aborted", "open")


def header(base: int, count: int, kind: str, txn: int = 0) -> BatchHeader:
    """A batch of ``count`` offsets from ``base``: kind "plain", "txn" (of producer 7, epoch 0, ``txn``),
    "control" (a control batch of that transaction) or "control-plain" (control bit only)."""
    attributes = {"plain": 0, "txn": ATTR_TRANSACTIONAL, "control": ATTR_TRANSACTIONAL | ATTR_CONTROL}.get(
        kind, ATTR_CONTROL
    )
    transactional = bool(attributes & ATTR_TRANSACTIONAL)
    return BatchHeader(
        base_offset=base,
        batch_length=64,
        crc=0,
        magic=1,
        reserved=0,
        attributes=attributes,
        last_offset_delta=count - 1,
        base_timestamp=0,
        max_timestamp=0,
        producer_id=7 if transactional else -1,
        producer_epoch=0 if transactional else -1,
        reserved2=0,
        base_sequence=txn if transactional else -1,
        record_count=count,
        payload_length=0,
    )


@dataclass(frozen=True)
class Batch:
    header: BatchHeader


def model(
    batches: list[tuple[str, int, int]], statuses: dict[int, str], start: int = 0
) -> tuple[list[int], int | None]:
    """read_committed from offset ``start``, written out plainly: the indexes of the batches returned, and the
    first offset not returned because of an open transaction (None when none was met)."""
    out = []
    offset = 0
    for i, (kind, count, txn) in enumerate(batches):
        base, offset = offset, offset + count
        if offset <= start:
            continue
        state = statuses[txn] if kind in ("txn", "control") else "committed"
        if state == "open":
            return out, max(base, start)
        if state == "committed" and kind in ("plain", "txn"):
            out.append(i)
    return out, None


def build(batches: list[tuple[str, int, int]]) -> list[BatchHeader]:
    headers, offset = [], 0
    for kind, count, txn in batches:
        headers.append(header(offset, count, kind, txn))
        offset += count
    return headers


batch_lists = st.lists(
    st.tuples(
        st.sampled_from(["plain", "txn", "txn", "control", "control-plain"]),
        st.integers(1, 5),
        st.integers(0, 4),
    ),
    max_size=12,
)
status_maps = st.fixed_dictionaries({t: st.sampled_from(STATUSES) for t in range(5)})


@settings(max_examples=300, deadline=None)
@given(batches=batch_lists, statuses=status_maps)
def test_visible_matches_the_model(batches: list[tuple[str, int, int]], statuses: dict[int, str]) -> None:
    headers = build(batches)
    asked: list[tuple[int, int, int]] = []

    def status(pid: int, epoch: int, txn: int) -> str:
        asked.append((pid, epoch, txn))
        return statuses[txn]

    vis = Visibility(status)
    returned, skip_to = vis.visible([Batch(h) for h in headers])
    expected, stop = model(batches, statuses)
    assert [b.header for b in returned] == [headers[i] for i in expected]
    looked_at = headers if stop is None else [h for h in headers if h.base_offset < stop]
    if expected or not looked_at:
        assert skip_to is None
    else:
        assert skip_to == looked_at[-1].next_offset  # all of them were skipped
    assert len(asked) == len(set(asked))  # each status asked once per read


@settings(max_examples=300, deadline=None)
@given(
    batches=batch_lists,
    statuses=status_maps,
    window=st.tuples(st.integers(0, 70), st.integers(0, 70)).map(sorted),
)
def test_committed_ranges_match_the_model(
    batches: list[tuple[str, int, int]], statuses: dict[int, str], window: list[int]
) -> None:
    """``committed(start, end)``: the offsets a reader returns are exactly those of the model's visible
    batches in ``[start, min(end, LSO))``; the skipped ranges are sorted, disjoint and merged."""
    total = sum(count for _, count, _ in batches)
    start, end = min(window[0], total), min(window[1], total)  # a range of the log
    headers = build(batches)
    result = Visibility(lambda pid, epoch, txn: statuses[txn]).committed(iter(headers), start, end)
    expected, stop = model(batches, statuses, start)
    lso = end if stop is None else min(stop, end)
    assert result.end == lso
    visible_offsets = {o for i in expected for o in range(headers[i].base_offset, headers[i].next_offset)}
    returned = {o for o in range(start, result.end) if not is_skipped(result.skipped, o)}
    assert returned == {o for o in visible_offsets if start <= o < lso}
    flat = [x for r in result.skipped for x in r]
    assert flat == sorted(flat)
    assert all(a < b for a, b in result.skipped)
    assert all(b < c for (_, b), (c, _) in zip(result.skipped, result.skipped[1:], strict=False))
    assert all(start <= a and b <= lso for a, b in result.skipped)


@pytest.mark.parametrize(
    ("kind", "state", "verdict"),
    [
        ("plain", "open", VISIBLE),
        ("txn", "committed", VISIBLE),
        ("txn", "aborted", ABORTED),
        ("txn", "open", OPEN),
        ("control", "committed", CONTROL),
        ("control", "aborted", ABORTED),
        ("control", "open", OPEN),
        ("control-plain", "open", CONTROL),
    ],
)
def test_classify_table(kind: str, state: str, verdict: str) -> None:
    assert Visibility(lambda *_: state).classify(header(0, 1, kind, 1)) == verdict


def test_expire_callback_is_asked_only_for_open_transactions_and_refreshes_the_status() -> None:
    decided = {1: "open", 2: "committed"}
    calls = []

    def expire() -> bool:
        calls.append(1)
        decided[1] = "aborted"
        return True

    vis = Visibility(lambda pid, epoch, txn: decided[txn], expire)
    assert vis.classify(header(0, 1, "txn", 2)) == VISIBLE
    assert calls == []
    assert vis.classify(header(1, 1, "txn", 1)) == ABORTED
    assert calls == [1]
    assert vis.classify(header(2, 1, "txn", 1)) == ABORTED  # cached: not asked again
    assert calls == [1]


def test_expire_that_aborts_nothing_leaves_the_transaction_open() -> None:
    vis = Visibility(lambda *_: "open", lambda: False)
    assert vis.classify(header(0, 1, "txn", 1)) == OPEN


def test_committed_is_plain_data() -> None:
    c = Visibility(lambda *_: "aborted").committed(build([("txn", 3, 1), ("txn", 2, 1)]), 1, 10)
    assert c == Committed(10, ((1, 5),))
