"""Exactly once under SIGKILL: a consume-transform-produce pipeline (read_committed consumer in a group, a
transactional producer, offsets sent with the transaction) is killed at random moments and restarted until it
finishes; every input record then has exactly one output among the committed records.

``PYLOG_TORTURE=1`` runs thousands of kills instead of a couple of hundred.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter

import pytest

import pylog

# the long mode (PYLOG_TORTURE=1) runs far past the default per-test limit
pytestmark = pytest.mark.timeout(7200 if os.environ.get("PYLOG_TORTURE") else 600)

KILLS = 2000 if os.environ.get("PYLOG_TORTURE") else 200
INPUT = 3000


def _pipeline(path: str, seed: int) -> None:
    """Runs in a forked child: transform ``in`` to ``out`` until nothing is left, then exit 0."""
    rng = random.Random(seed)
    with pylog.open(path) as log:
        consumer = log.consumer(
            group_id="pipeline",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
            heartbeat_interval_ms=100,
            session_timeout_ms=10_000,
        )
        consumer.subscribe(["in"])
        producer = log.producer(transactional_id="pipeline-0")
        producer.init_transactions()
        idle = 0
        while idle < 20:
            batch = consumer.poll(timeout_ms=20, max_records=rng.randint(1, 60))
            if not batch:
                idle = idle + 1 if consumer.assignment() and sum(consumer.lag().values()) == 0 else 0
                continue
            idle = 0
            producer.begin_transaction()
            for records in batch.values():
                for rec in records:
                    producer.send("out", rec.value * 10, key=rec.key)
            producer.send_offsets_to_transaction(
                {tp: records[-1].offset + 1 for tp, records in batch.items()}, "pipeline"
            )
            producer.commit_transaction()
        consumer.close()
        producer.close()


@pytest.mark.slow
def test_consume_transform_produce_is_exactly_once_under_sigkill(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "log")
    with pylog.open(path) as log:
        log.create_topic("in", partitions=3)
        log.create_topic("out", partitions=3)
        producer = log.producer()
        for i in range(INPUT):
            producer.send("in", i, key=f"k{i % 97}")
        producer.close()
    rng = random.Random(1234)
    kills = 0
    finished = False
    started = time.monotonic()
    while not finished:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                _pipeline(path, rng.randrange(1 << 30))
                code = 0
            finally:
                os._exit(code)
        if kills < KILLS:
            time.sleep(rng.uniform(0.005, 0.12))
            _, status = os.waitpid(pid, os.WNOHANG)
            if status == 0 and _ == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                kills += 1
                continue
            finished = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            assert finished, f"pipeline child failed with status {status}"
        else:
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"pipeline child failed: {status}"
            finished = True
    with pylog.open(path) as log:
        out = log.consumer(
            "out", auto_offset_reset="earliest", consumer_timeout_ms=0, isolation_level="read_committed"
        )
        got = Counter(r.value for r in out)
        duplicates = sum(c - 1 for c in got.values() if c > 1)
        missing = [i for i in range(INPUT) if got[i * 10] == 0]
        uncommitted = log.consumer("out", auto_offset_reset="earliest", consumer_timeout_ms=0)
        written = sum(1 for _ in uncommitted)
        committed = log.group_offsets("pipeline")
        ends = {
            tp: log.topic("in").partition(tp.partition).log_end_offset for tp in log.topic("in").partitions()
        }
    print(
        f"exactly-once: {kills} kills in {time.monotonic() - started:.1f} s, {INPUT} inputs, "
        f"{written} outputs written, {sum(got.values())} committed, {duplicates} duplicates, {len(missing)} missing"
    )
    assert kills == KILLS
    assert duplicates == 0 and not missing and set(got) == {i * 10 for i in range(INPUT)}
    assert {tp: om.offset for tp, om in committed.items()} == ends
