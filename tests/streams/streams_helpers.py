"""Helpers of the pylog.streams tests: read what an application committed, wait for it, and run an
application in a child process to kill."""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pylog
from pylog.streams.admin import read_store

DEADLINE_S = 60.0  # a bound against hanging, not a speed assertion


def committed_records(log: pylog.Log, topic: str, **config: Any) -> list[pylog.ConsumerRecord]:
    """Every committed record of ``topic``, partition by partition in offset order."""
    consumer = log.consumer(
        topic, isolation_level="read_committed", auto_offset_reset="earliest", consumer_timeout_ms=0, **config
    )
    try:
        return sorted(consumer, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    """Poll ``condition`` until true; fail after ``deadline_s`` (a hang, not a slow machine)."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class EchoCounts:
    """What an application of the kill tests committed: it echoes input ``i`` (topic ``in``) to ``echo`` and
    counts it for user ``f"u{i % users}"`` in store ``counts`` (each count sent to ``counts-out``)."""

    echo: Counter[int]  # committed echoes
    written: int  # echoes written, committed or not
    counts: dict[str, list[int]]  # committed counts per user, in order
    store: dict[Any, Any]  # the store's committed state
    offsets: dict[int, int]  # the group's committed offsets of ``in``
    ends: list[int]  # ``in``'s end offsets

    def duplicates(self) -> int:
        return sum(c - 1 for c in self.echo.values() if c > 1)

    def missing(self, inputs: int) -> int:
        return inputs - len(set(self.echo) & set(range(inputs)))

    def check_exactly_once(self, inputs: int, users: int) -> None:
        """Every input echoed once, each user's counts 1..n once and in order, the store equal to them, and the
        group's offsets at the input's end."""
        per_user = Counter(f"u{i % users}" for i in range(inputs))
        assert self.duplicates() == 0 and self.missing(inputs) == 0 and set(self.echo) == set(range(inputs))
        assert self.counts == {u: list(range(1, n + 1)) for u, n in per_user.items()}
        assert self.store == dict(per_user)
        assert self.offsets == self.ends


def read_echo_counts(path: str, app_id: str) -> EchoCounts:
    """Read what the application ``app_id`` over the log at ``path`` committed (see :class:`EchoCounts`)."""
    with pylog.open(path) as log:
        echo = Counter(r.value for r in committed_records(log, "echo"))
        written = sum(1 for _ in log.consumer("echo", auto_offset_reset="earliest", consumer_timeout_ms=0))
        counts: dict[str, list[int]] = {}
        for r in committed_records(log, "counts-out"):
            counts.setdefault(r.key.decode(), []).append(r.value)
        store = read_store(log, app_id, "counts")
        offsets = {
            tp.partition: om.offset for tp, om in log.group_offsets(app_id).items() if tp.topic == "in"
        }
        ends = log.topic("in").end_offsets()
    return EchoCounts(echo, written, counts, store, offsets, ends)


class Child:
    """``run`` in a forked child process, which never returns into pytest: it exits 0 when ``run`` returns,
    1 with the traceback printed (the test's output shows why) when it raises, or with the code of an
    ``os._exit`` in ``run``. Leaving a ``with`` block over it kills the child (SIGKILL) if it was not reaped
    yet, when the block ends by an error too."""

    def __init__(self, run: Callable[[], object]) -> None:
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                run()
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def wait(self) -> int:
        """Wait for the child to end: its exit code (-N when signal N ended it)."""
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        return os.waitstatus_to_exitcode(status)

    def terminate(self) -> None:
        """Ask it to stop as a deployment does (SIGTERM), without waiting."""
        os.kill(self.pid, signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM, and wait: it must stop cleanly (exit 0)."""
        self.terminate()
        code = self.wait()
        assert code == 0, f"the application exited with {code}"

    def kill(self) -> None:
        """SIGKILL, and reap it (nothing when it was reaped already)."""
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            self.wait()


def stop_all(children: Mapping[Any, Child]) -> None:
    """SIGTERM every child at once (they leave the group together), then wait for each: each must stop
    cleanly (exit 0)."""
    for child in children.values():
        child.terminate()
    for name, child in children.items():
        code = child.wait()
        assert code == 0, f"process {name} exited with {code}"


def suppress_model(
    records: list[tuple[Any, Any, int]], limit: int, max_records: int | None
) -> list[tuple[Any, Any, int]]:
    """What suppress(until_time_limit=limit, max_records=...) forwards, by brute force."""
    held: dict[Any, list[Any]] = {}  # key -> [first_time, seq, value, ts]
    out: list[tuple[Any, Any, int]] = []
    stream_time = -1
    for seq, (key, value, ts) in enumerate(records):
        stream_time = max(stream_time, ts)
        if key in held:
            held[key][2:] = [value, ts]
        else:
            held[key] = [ts, seq, value, ts]

        def oldest(held: dict[Any, list[Any]] = held) -> Any:
            return min(held, key=lambda name: (held[name][0], held[name][1]))

        while held and held[oldest()][0] <= stream_time - limit:
            k = oldest()
            out.append((k, held[k][2], held.pop(k)[3]))
        while max_records is not None and len(held) > max_records:
            k = oldest()
            out.append((k, held[k][2], held.pop(k)[3]))
    return out
