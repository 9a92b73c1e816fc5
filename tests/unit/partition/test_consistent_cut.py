"""``Topic.table(isolation_level="read_committed")`` shows every committed transaction whole: a transaction over
several partitions is in the table entirely or not at all, even while another transaction is open on one of
them (each partition's own last stable offset would show half of it). Checked against a model of the
partitions and their transactions, and ``consistent_cut`` against a naive fixpoint."""

from __future__ import annotations

import itertools
import os
import tempfile
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, example, given, settings

import pylog
from pylog.errors import ConfigError
from pylog.partition.visibility import consistent_cut

Span = dict[int, tuple[int, int]]


def _naive_cut(stable: dict[int, int], spans: list[Span]) -> dict[int, int]:
    """The same cut by brute force: lower the cuts for any split transaction until none is split."""
    cut = dict(stable)
    changed = True
    while changed:
        changed = False
        for span in spans:
            before = all(end <= cut[p] for p, (_, end) in span.items())
            after = all(first >= cut[p] for p, (first, _) in span.items())
            if not before and not after:
                for p, (first, _) in span.items():
                    if first < cut[p]:
                        cut[p] = first
                        changed = True
    return cut


@st.composite
def _cuts(draw: st.DrawFn) -> tuple[dict[int, int], list[Span]]:
    partitions = draw(st.integers(1, 4))
    stable = {p: draw(st.integers(0, 60)) for p in range(partitions)}
    spans: list[Span] = []
    for _ in range(draw(st.integers(0, 12))):
        parts = draw(st.sets(st.integers(0, partitions - 1), min_size=1))
        span: Span = {}
        for p in parts:
            first = draw(st.integers(0, 70))
            span[p] = (first, first + draw(st.integers(1, 10)))
        spans.append(span)
    return stable, spans


@settings(max_examples=300, deadline=None)
@given(_cuts())
def test_consistent_cut_is_the_greatest_cut_splitting_no_transaction(
    case: tuple[dict[int, int], list[Span]],
) -> None:
    stable, spans = case
    cut = consistent_cut(stable, spans)
    assert cut == _naive_cut(stable, spans)
    assert all(cut[p] <= stable[p] for p in stable)
    for span in spans:  # whole or not at all
        before = all(end <= cut[p] for p, (_, end) in span.items())
        after = all(first >= cut[p] for p, (first, _) in span.items())
        assert before or after


# -- the table against a model ------------------------------------------------------------------------------


@dataclass
class _Model:
    """Per partition the records in offset order as (key, transaction or None); transaction outcomes."""

    partitions: int
    records: list[list[tuple[bytes, tuple[int, int] | None]]] = field(default_factory=list)
    status: dict[tuple[int, int], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.records = [[] for _ in range(self.partitions)]

    def shown(self, txn: tuple[int, int] | None) -> bool:
        return txn is None or self.status[txn] == "committed"

    def stable(self) -> dict[int, int]:
        out = {}
        for p, recs in enumerate(self.records):
            opened = [i for i, (_, txn) in enumerate(recs) if txn is not None and self.status[txn] == "open"]
            out[p] = opened[0] if opened else len(recs)
        return out

    def table(self, *, atomic: bool) -> set[bytes]:
        cut = self.stable()
        if atomic:
            spans: dict[tuple[int, int], Span] = {}
            for p, recs in enumerate(self.records):
                for i, (_, txn) in enumerate(recs):
                    if txn is not None and self.status[txn] == "committed":
                        first, _ = spans.setdefault(txn, {}).get(p, (i, i + 1))
                        spans[txn][p] = (first, i + 1)
            cut = _naive_cut(cut, list(spans.values()))
        return {key for p, recs in enumerate(self.records) for key, txn in recs[: cut[p]] if self.shown(txn)}


@st.composite
def _histories(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """Steps ``(action, producer, partition)``: producers 0 and 1 each run a few transactions (one to four
    sends over the partitions, then a commit or an abort; the last one may stay open, producer 1's mostly),
    producer 2 sends outside transactions, and the three are interleaved at random."""
    queues: list[list[tuple[str, int, int]]] = []
    for who in (0, 1):
        steps: list[tuple[str, int, int]] = []
        for last in [False] * draw(st.integers(0, 3)) + [True]:
            for part in draw(st.lists(st.integers(0, 2), min_size=1, max_size=4)):
                steps.append(("send", who, part))
            ends = ["commit", "commit", "abort"] + (["open"] * (1 + 2 * who) if last else [])
            end = draw(st.sampled_from(ends))
            if end != "open":
                steps.append((end, who, 0))
        queues.append(steps)
    queues.append([("send", 2, part) for part in draw(st.lists(st.integers(0, 2), max_size=6))])
    out: list[tuple[str, int, int]] = []
    while any(queues):
        live = [q for q in queues if q]
        out.append(live[draw(st.integers(0, len(live) - 1))].pop(0))
    return out


# the trial's case: producer 1's transaction stays open on partition 1 while producer 0's commits on 0 and 1
_TRIAL_CASE = [
    ("send", 1, 1),
    ("send", 0, 0),
    ("send", 2, 1),
    ("send", 0, 1),
    ("commit", 0, 0),
    ("send", 2, 0),
]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partitions=st.integers(2, 3), steps=_histories())
@example(partitions=2, steps=_TRIAL_CASE)
def test_read_committed_table_shows_each_transaction_whole(
    partitions: int, steps: list[tuple[str, int, int]]
) -> None:
    """Producers 0 and 1 are transactional, producer 2 is not. Each record has a key of its own, so the table's
    keys are exactly the records it shows."""
    model = _Model(partitions)
    with tempfile.TemporaryDirectory() as tmp, pylog.open(os.path.join(tmp, "log")) as log:
        log.create_topic("t", partitions=partitions)
        producers = [log.producer(transactional_id=f"tx{i}", value_serializer=None) for i in range(2)]
        producers.append(log.producer(value_serializer=None))
        for p in producers[:2]:
            p.init_transactions()
        current: list[tuple[int, int] | None] = [None, None]
        count = [0, 0]
        for n, (action, who, part) in enumerate(steps):
            part %= partitions
            if action == "send":
                key = b"k%d" % n
                if who < 2 and current[who] is None:
                    producers[who].begin_transaction()
                    current[who] = (who, count[who])
                    count[who] += 1
                    model.status[current[who]] = "open"  # type: ignore[index]
                producers[who].send("t", key, key=key, partition=part)
                producers[who].flush()  # offsets in the order of the steps
                model.records[part].append((key, current[who] if who < 2 else None))
            elif who < 2 and current[who] is not None:
                if action == "commit":
                    producers[who].commit_transaction()
                else:
                    producers[who].abort_transaction()
                model.status[current[who]] = "committed" if action == "commit" else "aborted"  # type: ignore[index]
                current[who] = None
        topic = log.topic("t")
        atomic = set(topic.table(isolation_level="read_committed", value_deserializer=None))
        per_partition = set(
            topic.table(isolation_level="read_committed", value_deserializer=None, atomic=False)
        )
        assert atomic == model.table(atomic=True)
        assert per_partition == model.table(atomic=False)
        assert atomic <= per_partition
        for txn, state in model.status.items():  # the invariant itself: whole or not at all
            keys = {k for recs in model.records for k, t in recs if t == txn}
            if state == "committed":
                assert keys <= atomic or not keys & atomic
        for p in producers:
            p.close()


def test_money_moved_in_transactions_is_conserved_while_another_is_open(log_dir: str) -> None:
    """The trial's case: transfers between an account on partition 0 and one on partition 1, each a
    transaction; another transaction stays open on partition 1. The total of the balances the table shows is
    what was put in."""
    with pylog.open(log_dir) as log:
        log.create_topic("balances", partitions=2)
        bank = log.producer(transactional_id="bank", value_serializer=None)
        other = log.producer(transactional_id="other", value_serializer=None)
        bank.init_transactions()
        other.init_transactions()
        bank.begin_transaction()
        bank.send("balances", b"1500", key=b"alice", partition=0)
        bank.send("balances", b"1500", key=b"bob", partition=1)
        bank.commit_transaction()
        other.begin_transaction()
        other.send("balances", b"0", key=b"carol", partition=1)  # open: partition 1 stops here
        other.flush()
        alice, bob = 1500, 1500
        for amount in itertools.islice(itertools.cycle([7, 3, 11]), 30):
            alice, bob = alice - amount, bob + amount
            bank.begin_transaction()
            bank.send("balances", b"%d" % alice, key=b"alice", partition=0)
            bank.send("balances", b"%d" % bob, key=b"bob", partition=1)
            bank.commit_transaction()
        topic = log.topic("balances")
        table = topic.table(isolation_level="read_committed", value_deserializer=int)
        assert table == {b"alice": 1500, b"bob": 1500}  # the state before the open transaction: whole
        half = topic.table(isolation_level="read_committed", value_deserializer=int, atomic=False)
        assert sum(half.values()) != 3000  # Kafka's per-partition rule, on request: half of each transfer
        other.commit_transaction()
        table = topic.table(isolation_level="read_committed", value_deserializer=int)
        assert table == {b"alice": alice, b"bob": bob, b"carol": 0} and alice + bob == 3000
        bank.close()
        other.close()


def test_atomic_must_be_a_bool(log: pylog.Log) -> None:
    log.create_topic("t")
    with pytest.raises(ConfigError, match="atomic"):
        log.topic("t").table(isolation_level="read_committed", atomic="yes")  # type: ignore[arg-type]
