"""The Quix Streams side of the streams benchmark: a keyed one-minute tumbling-window count.

Run as a script by an interpreter that has ``quixstreams`` (its own virtualenv, ``make quix-env``: Quix Streams
pins confluent-kafka, pydantic and pydantic-settings below the versions pylog's environment holds), never
imported by the benchmark registry. It reads every record of topic ``--topic`` from the Kafka-protocol broker
at ``--servers`` with a Quix ``Application`` (consumer group ``--group``, ``auto_offset_reset="earliest"``,
``processing_guarantee`` as asked, state in RocksDB under ``--state-dir`` with its changelog topics), counts
records per key in ``tumbling_window(60_000).count().current()`` (every update emitted, as
``pylog.streams``' default ``emit="update"``), stops after ``--records`` outputs (one per input record), and
prints one JSON line: the seconds from the first record processed to the end of ``run()`` (its last
checkpoint committed), the seconds before that first record (group join, topic checks), and the group's
committed offsets against the partitions' end offsets.

    build/quix-venv/bin/python benchmarks/cases/quix_app.py --servers 127.0.0.1:9092 --topic in \
        --records 1000000 --guarantee exactly-once --state-dir /tmp/quix-state
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import time
from typing import Any

WINDOW_MS = 60_000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--guarantee", choices=("exactly-once", "at-least-once"), required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--group", default="quix-bench")
    p.add_argument("--commit-interval", type=float, default=5.0, help="seconds (Quix's default: 5)")
    args = p.parse_args()

    from confluent_kafka import Consumer, TopicPartition
    from quixstreams import Application

    app = Application(
        broker_address=args.servers,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee=args.guarantee,
        commit_interval=args.commit_interval,
        state_dir=args.state_dir,
        loglevel=logging.WARNING,
    )
    topic = app.topic(args.topic, key_deserializer="bytes", value_deserializer="bytes")
    first: list[float] = []

    def mark(_value: Any) -> None:  # the time of the first record processed, once
        if not first:
            first.append(time.perf_counter())

    sdf = app.dataframe(topic)
    sdf = sdf.update(mark)
    sdf = sdf.tumbling_window(duration_ms=WINDOW_MS).count().current()
    t0 = time.perf_counter()
    app.run(count=args.records, collect=False)
    t1 = time.perf_counter()
    if not first:
        raise SystemExit("no record was processed")

    check = Consumer({"bootstrap.servers": args.servers, "group.id": args.group, "enable.auto.commit": False})
    meta = check.list_topics(args.topic, timeout=30).topics[args.topic]
    tps = [TopicPartition(args.topic, p) for p in sorted(meta.partitions)]
    committed = {tp.partition: tp.offset for tp in check.committed(tps, timeout=30)}
    ends = {tp.partition: check.get_watermark_offsets(tp, timeout=30)[1] for tp in tps}
    check.close()
    print(
        json.dumps(
            {
                "seconds": t1 - first[0],
                "startup_s": first[0] - t0,
                "committed": sum(committed.values()),
                "end": sum(ends.values()),
                "quixstreams": importlib.metadata.version("quixstreams"),
                "confluent_kafka": importlib.metadata.version("confluent-kafka"),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
