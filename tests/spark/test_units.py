"""Parts of the data source that need no Spark job: Arrow schema, planning, data loss, filters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from spark_helpers import make_log, needs_java

import pylog
from pylog.errors import ConfigError, OffsetOutOfRangeError
from pylog.spark.batches import ReadSpec, read_range, read_ranges
from pylog.spark.filters import Bounds, push
from pylog.spark.options import PACK_BYTES, PACK_RECORDS, OffsetRange, Options, plan_splits, split_ranges
from pylog.spark.reader import PylogReader, PylogStreamReader

pytestmark = pytest.mark.spark

KAFKA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"


def _schema_json(ddl: str) -> str:
    from pyspark.sql.types import StructType

    fields = {
        "binary": "binary",
        "string": "string",
        "int": "integer",
        "long": "long",
        "timestamp": "timestamp",
    }
    out = []
    for part in ddl.split(", "):
        name, typ = part.split(" ", 1)
        if typ.startswith("array"):
            t: Any = {
                "type": "array",
                "elementType": {
                    "type": "struct",
                    "fields": [
                        {"name": "key", "type": "string", "nullable": True, "metadata": {}},
                        {"name": "value", "type": "binary", "nullable": True, "metadata": {}},
                    ],
                },
                "containsNull": True,
            }
        else:
            t = fields[typ]
        out.append({"name": name, "type": t, "nullable": True, "metadata": {}})
    return StructType.fromJson({"type": "struct", "fields": out}).json()


@pytest.mark.parametrize("ddl", [KAFKA, KAFKA + ", headers array<struct<key:string,value:binary>>"])
def test_arrow_schema_equals_sparks(tmp_path: Any, ddl: str) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_json_string

    path = str(tmp_path / "log")
    make_log(path, seed=5, records=300)
    schema_json = _schema_json(ddl)
    spec = ReadSpec(path, schema_json, False, "binary", Bounds())
    batches = list(read_range(spec, OffsetRange("a", 0, 0, 10**9)))
    assert batches
    want = to_arrow_schema(_parse_datatype_json_string(schema_json), timezone="UTC")
    assert batches[0].schema == want
    assert all(f.nullable for f in batches[0].schema)


def test_data_loss_after_planning(tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    make_log(path, seed=4, records=400)
    reader = PylogReader(Options({"path": path, "subscribe": "b"}), _schema_json(KAFKA))
    (part,) = reader.partitions()
    (rng,) = part.ranges
    assert rng.start == 0
    with pylog.open(path) as log:
        log.alter_topic("b", retention_bytes=3000, retention_ms=-1)
        assert log.topic("b").apply_retention() > 0
        new_start = log.topic("b").partition(0).log_start_offset
    assert 0 < new_start < rng.end
    with pytest.raises(OffsetOutOfRangeError, match="data loss reading b-0"):
        list(reader.read(part))
    lenient = PylogReader(
        Options({"path": path, "subscribe": "b", "failOnDataLoss": "false"}), _schema_json(KAFKA)
    )
    spec = lenient.partitions()[0].spec
    got = [o for rb in read_range(spec, rng) for o in rb.column("offset").to_pylist()]
    assert got == list(range(new_start, rng.end))


def test_appended_after_planning_not_read(tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    make_log(path, seed=4, records=100)
    reader = PylogReader(Options({"path": path, "subscribe": "b"}), _schema_json(KAFKA))
    (part,) = reader.partitions()
    (rng,) = part.ranges
    with pylog.open(path) as log:
        producer = log.producer()
        producer.send_batch("b", values=[b"x"] * 50)
        producer.close()
    got = [o for rb in reader.read(part) for o in rb.column("offset").to_pylist()]
    assert got == list(range(rng.start, rng.end))


def test_split_ranges_is_proportional() -> None:
    ranges = [OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 10, 110), OffsetRange("t", 2, 5, 5)]
    out = split_ranges(ranges, 10)
    assert sum(1 for r in out if r.partition == 0) == 9
    assert sum(1 for r in out if r.partition == 1) == 1
    covered = sorted((r.partition, o) for r in out for o in range(r.start, r.end))
    assert covered == sorted([(0, o) for o in range(900)] + [(1, o) for o in range(10, 110)])
    assert split_ranges(ranges, 1) == ranges[:2]


def test_plan_splits_packs_small_ranges() -> None:
    small = [OffsetRange("t", p, 0, 100) for p in range(1000)]
    assert plan_splits(small, 0, {}) == [tuple(small)]
    groups = plan_splits(small, 10, {})
    assert len(groups) == 10 and [r for g in groups for r in g] == small
    big = [OffsetRange("t", 0, 0, PACK_RECORDS), OffsetRange("t", 1, 5, 6), OffsetRange("t", 2, 0, 7)]
    assert plan_splits(big, 0, {}) == [(big[0],), (big[1], big[2])]
    for per_range, sizes in ((2 / 3, [1, 1, 1, 1, 1]), (0.4, [2, 2, 1])):  # a range's share of PACK_BYTES
        bytes_per_offset = {("t", p): PACK_BYTES * per_range / 100 for p in range(5)}
        assert [len(g) for g in plan_splits(small[:5], 0, bytes_per_offset)] == sizes


def test_one_output_batch_spans_ranges_of_several_topics(tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        for topic in ("x", "longer-name"):
            log.create_topic(topic, partitions=2)
            producer = log.producer(value_serializer=None)
            for p in range(2):
                producer.send_batch(topic, values=[b"%s-%d" % (topic.encode(), p)] * 3, partition=p)
            producer.close()
    ranges = [OffsetRange(t, p, 1, 3) for t in ("x", "longer-name") for p in (1, 0)]
    spec = ReadSpec(path, _schema_json(KAFKA), True, "binary", Bounds())
    (rb,) = read_ranges(spec, ranges)
    got = list(
        zip(*(rb.column(c).to_pylist() for c in ("topic", "partition", "offset", "value")), strict=True)
    )
    assert got == [
        (t, p, o, b"%s-%d" % (t.encode(), p))
        for t, p in [(r.topic, r.partition) for r in ranges]
        for o in (1, 2)
    ]


def test_large_and_small_batches_read_as_pylogs_consumer_reads_them(tmp_path: Any) -> None:
    """Decoded batches of OWN_BATCH_ROWS rows or more become output batches of their own, their key and value
    columns views of the segment; smaller ones are gathered. Ranges that start and end inside large and small
    batches, over two partitions, with null keys and values, read as pylog's consumer reads them."""
    from pylog.spark.batches import OWN_BATCH_ROWS

    path = str(tmp_path / "log")
    big = OWN_BATCH_ROWS + 1000
    with pylog.open(path) as log:
        log.create_topic("t", partitions=2)
        producer = log.producer(value_serializer=None, batch_size=1 << 22)
        for p in range(2):
            for n in (big, 5, big, 300, 7):
                base = log.topic("t").partition(p).log_end_offset
                keys = [None if i % 7 == 0 else b"k%d" % (base + i) for i in range(n)]
                values = [
                    None if i % 11 == 3 and i % 7 else b"v%d-%d" % (p, base + i) * (i % 3) for i in range(n)
                ]
                producer.send_batch("t", keys=keys, values=values, partition=p)
                producer.flush()
        producer.close()
        end = log.topic("t").partition(0).log_end_offset
        consumer = log.consumer(value_deserializer=None, auto_offset_reset="earliest", consumer_timeout_ms=0)
        consumer.assign(list(log.topic("t").partitions()))
        want = {(r.partition, r.offset): (r.key, r.value) for r in consumer}
        consumer.close()
    ranges = [OffsetRange("t", 1, 17, end - 3), OffsetRange("t", 0, big - 20, end)]
    spec = ReadSpec(path, _schema_json(KAFKA), True, "binary", Bounds())
    batches = list(read_ranges(spec, ranges))
    assert len(batches) > 3 and any(rb.num_rows >= OWN_BATCH_ROWS for rb in batches)
    got = [
        ((p, o), (k, v))
        for rb in batches
        for p, o, k, v in zip(
            *(rb.column(c).to_pylist() for c in ("partition", "offset", "key", "value")), strict=True
        )
    ]
    assert got == [((r.partition, o), want[(r.partition, o)]) for r in ranges for o in range(r.start, r.end)]


def test_push_returns_the_same_unhandled_objects() -> None:
    import datetime as dt

    from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNotNull, LessThan, Not

    handled = [
        EqualTo(("partition",), 1),
        GreaterThan(("offset",), 5),
        LessThan(("timestamp",), dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),
        In(("topic",), ("a", "b")),
    ]
    unhandled = [
        IsNotNull(("key",)),
        Not(EqualTo(("offset",), 3)),
        EqualTo(("offset",), "3"),
        EqualTo(("value",), b"x"),
    ]
    bounds = Bounds()
    back = push(bounds, handled + unhandled)
    assert len(back) == len(unhandled) and all(a is b for a, b in zip(back, unhandled, strict=True))
    assert bounds.narrow(0, 100) == (6, 100)
    assert bounds.admits_partition("a", 1) and not bounds.admits_partition("a", 2)
    assert not bounds.admits_partition("c", 1)


def test_stream_offsets_round_trip_as_json(tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("s", partitions=12)
        producer = log.producer()
        producer.send_batch("s", keys=[str(i).encode() for i in range(500)], values=[b"v"] * 500)
        producer.close()
    reader = PylogStreamReader(Options({"path": path, "subscribe": "s", "startingOffsets": "earliest"}), "{}")
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    for offsets in (start, end):
        assert json.dumps(json.loads(json.dumps(offsets))) == json.dumps(offsets)
        assert list(offsets["s"]) == sorted(offsets["s"])
    assert sum(end["s"].values()) == 500
    from pyspark.sql.streaming.datasource import ReadMaxRows

    capped = reader.latestOffset(start, ReadMaxRows(100))
    assert 80 <= sum(capped["s"].values()) <= 100


def test_pyspark_pylog_imports_without_pyspark(tmp_path: Any) -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None; import pyspark_pylog; "
        "print(pyspark_pylog.DefaultSource.name(), hasattr(pyspark_pylog.DefaultSource, 'unavailable_reason'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["pylog", "True"]
    code = "import pyspark_pylog, pyspark.sql.datasource as d; print(issubclass(pyspark_pylog.DefaultSource, d.DataSource))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True"


def test_planned_partition_pickles_with_its_ranges_as_json(tmp_path: Any) -> None:
    """What pylog's JVM reader reads from a planned partition: the ranges and the read settings, as JSON."""
    import pickle
    import pickletools

    path = str(tmp_path / "log")
    make_log(path, seed=4, records=300)
    with pylog.open(path) as log:  # a compacted topic: its offsets may have gaps, its ranges are not dense
        log.create_topic("c", partitions=1, cleanup_policy="compact")
        producer = log.producer()
        for i in range(20):
            producer.send("c", i, key=b"k%d" % (i % 3))
        producer.close()
    opts = Options({"path": path, "subscribe": "a,b,c", "failOnDataLoss": "false", "minPartitions": "3"})
    parts = PylogReader(opts, _schema_json(KAFKA)).partitions()
    assert len(parts) >= 3
    assert {r.topic for part in parts for r in part.ranges} == {"a", "b", "c"}
    for part in parts:
        raw = pickle.dumps(part)
        assert pickle.loads(raw) == part  # the Python reader gets the same partition back
        strings = [
            arg for op, arg, _ in pickletools.genops(raw) if isinstance(arg, str) and arg.startswith("{")
        ]
        plan = json.loads(strings[0])
        assert plan == {
            "path": part.spec.path,
            "failOnDataLoss": False,
            "ranges": [[r.topic, r.partition, r.start, r.end, [], r.topic != "c"] for r in part.ranges],
        }


def test_planned_partition_carries_pushed_timestamp_bounds(tmp_path: Any) -> None:
    """The JVM reader skips segments and batches by the pushed timestamp bounds (microseconds, inclusive)."""
    import datetime as dt
    import pickle

    from pyspark.sql.datasource import GreaterThanOrEqual, In, LessThan

    from pylog.spark.reader import PylogFilteringReader, _restore

    path = str(tmp_path / "log")
    make_log(path, seed=4, records=100)
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    us = (t0 - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    cases = [
        ([GreaterThanOrEqual(("timestamp",), t0)], {"lo": us, "hi": None, "values": None}),
        ([LessThan(("timestamp",), t0)], {"lo": None, "hi": us - 1, "values": None}),
        (
            [In(("timestamp",), (t0 + dt.timedelta(milliseconds=5), t0))],
            {"lo": None, "hi": None, "values": [us, us + 5000]},
        ),
        ([GreaterThanOrEqual(("offset",), 3)], None),
    ]
    for filters, want in cases:
        reader = PylogFilteringReader(Options({"path": path, "subscribe": "a"}), _schema_json(KAFKA))
        assert reader.pushFilters(filters) == []
        for part in reader.partitions():
            fn, (plan_json, _state) = part.__reduce__()
            assert fn is _restore and pickle.loads(pickle.dumps(part)) == part
            assert json.loads(plan_json).get("timestamp") == want


def test_jvm_reader_build_needs_javac(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pylog.errors import ConfigError
    from pylog.spark import jvm

    monkeypatch.setattr(jvm, "jar_path", lambda: tmp_path / "pylog-spark.jar")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(ConfigError, match="javac"):
        jvm.build()
    assert not (tmp_path / "pylog-spark.jar").exists()


def test_partitions_never_used_read_as_empty(tmp_path: Any) -> None:
    """pylog creates a partition's files on first use: a topic whose partitions were never written has
    empty directories, which plan and read as empty partitions (not as missing segment files)."""
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("sparse", partitions=4)
        log.producer(value_serializer=None).send("sparse", b"only", partition=2).get()
    reader = PylogReader(Options({"path": path, "subscribe": "sparse"}), _schema_json(KAFKA))
    got = [
        (p, o)
        for part in reader.partitions()
        for rb in reader.read(part)
        for p, o in zip(rb.column("partition").to_pylist(), rb.column("offset").to_pylist(), strict=True)
    ]
    assert got == [(2, 0)]


@pytest.mark.parametrize("seed", range(30))
def test_min_partitions_is_a_minimum(seed: int) -> None:
    """Against the definition: every offset planned once, in order, and at least minPartitions Spark
    partitions whenever there are that many offsets (Kafka's rounding could give fewer)."""
    import random

    rng = random.Random(seed)
    ranges = [
        OffsetRange(t, p, start, start + rng.choice([0, 1, 3, 17, 5000, rng.randint(1, 1000)]))
        for t in ("a", "b")
        for p in range(rng.randint(1, 4))
        for start in [rng.randint(0, 50)]
    ]
    total = sum(r.size for r in ranges)
    want = rng.randint(1, 40)
    groups = plan_splits(ranges, want, {})
    assert len(groups) >= min(want, total)
    equal = [OffsetRange("t", p, 0, 100) for p in range(3)]  # Kafka's rounding: 3 x round(3.33) = 9 parts
    assert len(plan_splits(equal, 10, {})) == len(split_ranges(equal, 10)) == 10
    covered = [(r.topic, r.partition, o) for g in groups for r in g for o in range(r.start, r.end)]
    assert covered == [(r.topic, r.partition, o) for r in ranges for o in range(r.start, r.end)]


class _FakeBuilder:
    """Records what a SparkSession.Builder is given."""

    def __init__(self) -> None:
        self.settings: dict[str, str] = {}

    def appName(self, name: str) -> _FakeBuilder:
        self.settings["spark.app.name"] = name
        return self

    def master(self, master: str) -> _FakeBuilder:
        self.settings["spark.master"] = master
        return self

    def config(self, key: str, value: str) -> _FakeBuilder:
        self.settings[key] = value
        return self


def test_session_builder_sets_the_workers_python_and_the_jvm_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    from pylog.spark import builder, jvm

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setattr(jvm, "build", lambda force=False: "/x/pylog-spark.jar")
    b = builder("local[3]", "app", config={"spark.sql.shuffle.partitions": "4"}, base=_FakeBuilder())
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert b.settings == {
        "spark.app.name": "app",
        "spark.master": "local[3]",
        "spark.sql.shuffle.partitions": "4",
        "spark.pyspark.python": sys.executable,
        "spark.jars": "/x/pylog-spark.jar",
        "spark.sql.extensions": jvm.EXTENSIONS,
        jvm.ENABLED: "true",
    }
    assert "spark.jars" not in builder(jvm_reader=False, base=_FakeBuilder()).settings


def test_session_builder_without_a_jdk(monkeypatch: pytest.MonkeyPatch) -> None:
    from pylog.spark import builder, jvm

    def no_javac(force: bool = False) -> str:
        raise ConfigError("javac (JDK 17 or later) is needed")

    monkeypatch.setattr(jvm, "build", no_javac)
    assert "spark.jars" not in builder(base=_FakeBuilder()).settings  # default: the Python path
    with pytest.raises(ConfigError, match="javac"):
        builder(jvm_reader=True, base=_FakeBuilder())


SESSION_SCRIPT = """
import sys, pylog, pylog.spark
path = sys.argv[1]
with pylog.open(path) as log:
    log.create_topic("t", partitions=2)
    producer = log.producer(value_serializer=None)
    producer.send_batch("t", keys=[b"k%d" % i for i in range(50)], values=[b"v"] * 50)
    producer.close()
spark = pylog.spark.session("local[1]", jvm_reader=False, config={"spark.ui.enabled": "false",
                                                                  "spark.driver.host": "127.0.0.1"})
stream = spark.readStream.format("pylog").option("subscribe", "t").option("startingOffsets", "earliest").load(path)
query = stream.writeStream.format("memory").queryName("copy").trigger(availableNow=True).start()
query.awaitTermination(120)
print("rows", spark.read.format("pylog").option("subscribe", "t").load(path).count(),
      spark.sql("SELECT count(*) FROM copy").first()[0])
spark.stop()
"""


@needs_java
def test_session_works_without_the_virtualenv_on_path(tmp_path: Any) -> None:
    """Run as a user who calls the project's Python by its path, with no virtualenv activated: Spark's
    default worker Python (python3 on PATH) has no pylog; the session's workers run this interpreter."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    done = subprocess.run(
        [sys.executable, "-c", SESSION_SCRIPT, str(tmp_path / "log")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["rows", "50", "50"]
