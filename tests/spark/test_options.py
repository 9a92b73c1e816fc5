"""Option checking of ``format("pylog")`` against Spark's Kafka source: unknown and Kafka-only options,
batch-only and stream-only options, offsets JSON naming topics and partitions, valueSchema names, the
failOnDataLoss=false warnings, maxRecordsPerPartition. Pure logic first; one test on a real SparkSession."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from spark_helpers import make_log, needs_java

import pylog
from pylog.errors import ConfigError
from pylog.spark.batches import ReadSpec, read_range
from pylog.spark.filters import Bounds
from pylog.spark.options import (
    BATCH_ONLY,
    KAFKA_ONLY,
    READ_OPTIONS,
    STREAM_ONLY,
    OffsetRange,
    Options,
    check_read_options,
    check_write_options,
    parse_duration_ms,
    plan_splits,
    split_ranges,
    value_schema_names,
)
from pylog.spark.reader import PylogReader, PylogStreamReader
from pylog.spark.snapshot import LogView

pytestmark = pytest.mark.spark

BASE = {"subscribe": "a"}


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("options") / "log")
    make_log(path, seed=3, records=200)
    return path


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("startingOffset", "startingOffsets"),
        ("subscribePatern", "subscribePattern"),
        ("failOnDataLos", "failOnDataLoss"),
        ("includeHeader", "includeHeaders"),
        ("minPartition", "minPartitions"),
        ("endingOffset", "endingOffsets"),
    ],
)
def test_unknown_option_names_the_closest_known_one(typo: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=rf"unknown option '{typo.lower()}'.*did you mean '{meant}'\?"):
        Options({**BASE, typo: "x"})


def test_every_known_option_passes_the_name_check_in_any_case() -> None:
    for name in READ_OPTIONS.values():
        assert check_read_options({name.upper(): "1"}) == {name.lower(): "1"}


@pytest.mark.parametrize("key", sorted(KAFKA_ONLY))
def test_kafka_only_options_say_what_to_use_instead(key: str) -> None:
    with pytest.raises(ConfigError, match=r"does not apply to pylog: ") as info:
        Options({**BASE, key: "x"})
    assert key in str(info.value) and KAFKA_ONLY[key] in str(info.value)


def test_bootstrap_servers_points_at_the_log_directory() -> None:
    with pytest.raises(ConfigError, match="give the log directory instead"):
        Options({**BASE, "kafka.bootstrap.servers": "localhost:9092"})


@pytest.mark.parametrize(
    "key", ["kafka.security.protocol", "kafka.max.poll.records", "kafka.fetch.min.bytes"]
)
def test_other_kafka_client_settings_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=r"no Kafka client.*kafka\.isolation\.level"):
        Options({**BASE, key: "1"})


def test_stream_only_options_are_refused_on_a_batch_read(log_path: str) -> None:
    for name in STREAM_ONLY:
        opts = Options({**BASE, "path": log_path, name: "10"})  # the query kind is not known yet
        with pytest.raises(ConfigError, match=f"option {name} only applies to streaming queries"):
            PylogReader(opts, "{}")
        PylogStreamReader(opts, "{}")  # fine on a stream


def test_batch_only_options_are_refused_on_a_stream(log_path: str) -> None:
    for name in BATCH_ONLY:
        opts = Options({**BASE, "path": log_path, name: "latest" if name == "endingOffsets" else "1"})
        with pytest.raises(ConfigError, match=f"option {name} is not valid in streaming queries"):
            PylogStreamReader(opts, "{}")
        PylogReader(opts, "{}")


def test_min_above_max_offsets_per_trigger_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"minOffsetsPerTrigger \(10\) is higher than maxOffsetsPerTrigger \(5\)"
    ):
        Options({**BASE, "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"})
    assert (
        Options({**BASE, "minOffsetsPerTrigger": "5", "maxOffsetsPerTrigger": "5"}).min_offsets_per_trigger
        == 5
    )


@pytest.mark.parametrize(
    ("text", "ms"),
    [("15m", 900_000), ("30s", 30_000), ("500ms", 500), ("250", 250), ("1h", 3_600_000), ("2d", 172_800_000)],
)
def test_durations_in_sparks_notation(text: str, ms: int) -> None:
    assert parse_duration_ms(text, "maxTriggerDelay") == ms


@pytest.mark.parametrize("text", ["", "m", "-5s", "1.5m", "10 parsecs"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="must be a duration"):
        Options({**BASE, "maxTriggerDelay": text})


def test_default_trigger_delay_is_kafkas_15_minutes() -> None:
    assert Options(BASE).max_trigger_delay_ms == 15 * 60_000


def test_write_options_are_checked_with_the_same_rules() -> None:
    assert check_write_options({"PATH": "/x", "Topic": "t", "acks": "all"}) == {
        "path": "/x",
        "topic": "t",
        "acks": "all",
    }
    with pytest.raises(ConfigError, match="did you mean 'topic'"):
        check_write_options({"topik": "t"})
    with pytest.raises(ConfigError, match="give the log directory instead"):
        check_write_options({"kafka.bootstrap.servers": "h:9092"})
    with pytest.raises(ConfigError, match="use the option acks"):
        check_write_options({"kafka.acks": "all"})
    assert check_write_options({"checkpointLocation": "/c"}, extra=("checkpointLocation",))


# -- offsets JSON names topics and partitions the query reads ---------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"subscribe": "a", "startingOffsets": '{"aa": {"0": 1}}'},
            r"names topic 'aa', which this query does not read \(did you mean 'a'\?\)",
        ),
        (
            {"subscribe": "a", "endingOffsets": '{"b": {"0": 1}}'},
            "names topic 'b', which this query does not read",
        ),
        (
            {"subscribe": "a", "startingOffsets": '{"a": {"3": 1}}'},
            r"names a-3, which does not exist \(topic 'a' has partitions 0..2\)",
        ),
        (
            {"subscribePattern": "b.*", "startingOffsetsByTimestamp": '{"a": {"0": 1}}'},
            "names topic 'a', which this query does not read",
        ),
        (
            {"assign": '{"a": [0, 2]}', "startingOffsets": '{"a": {"1": 5}}'},
            "names a-1, which is not assigned",
        ),
        (
            {"subscribe": "a", "endingOffsetsByTimestamp": '{"a": {"x": 5}}'},
            "'x' of topic 'a' is not a partition number",
        ),
        ({"subscribe": "a", "startingOffsets": '{"a": [0]}'}, "must look like"),
    ],
)
def test_offsets_json_must_name_read_topics_and_existing_partitions(
    log_path: str, options: dict[str, str], match: str
) -> None:
    opts = Options({"path": log_path, **options})
    with pytest.raises(ConfigError, match=match):
        opts.check_offset_options(LogView(log_path))
    with pytest.raises(ConfigError, match=match):
        PylogReader(opts, "{}").partitions()


def test_offsets_json_of_read_partitions_is_fine(log_path: str) -> None:
    for options in (
        {"subscribe": "a,b", "startingOffsets": '{"a": {"0": 1, "2": -2}, "b": {"0": 0}}'},
        {"subscribePattern": "[ab]", "endingOffsets": '{"b": {"0": -1}}'},
        {"assign": '{"a": [1]}', "startingOffsetsByTimestamp": '{"a": {"1": 0}}'},
        {"subscribe": "a", "startingOffsets": "earliest", "endingOffsets": "latest"},
    ):
        Options({"path": log_path, **options}).check_offset_options(LogView(log_path))


# -- valueSchema --------------------------------------------------------------------------------------------


def test_value_schema_names_parse_ddl() -> None:
    assert value_schema_names(
        "a long, `b, c` string, d struct<x:int, y:map<string,int>>, e DECIMAL(10, 2)"
    ) == [
        "a",
        "b, c",
        "d",
        "e",
    ]
    assert value_schema_names("x: int, `we``ird` string") == ["x", "we`ird"]


@pytest.mark.parametrize(
    "ddl", ["topic string", "user long, Offset long", "`timestamp` long", "HEADERS string"]
)
def test_value_schema_field_named_like_a_kafka_column_is_refused(ddl: str) -> None:
    with pytest.raises(ConfigError, match=r"option valueSchema names .*the name of a Kafka column"):
        Options({**BASE, "valueFormat": "msgpack", "valueSchema": ddl})


def test_value_schema_other_names_are_fine() -> None:
    Options(
        {**BASE, "valueFormat": "msgpack", "valueSchema": "user long, topic_name string, offsets array<int>"}
    )


# -- failOnDataLoss=false warns, naming the partition and the offsets skipped -------------------------------


def test_starting_offset_outside_the_log_warns_naming_the_offsets(log_path: str, caplog: Any) -> None:
    view = LogView(log_path).partition("b", 0)
    end = view.log_end_offset
    opts = Options(
        {
            "path": log_path,
            "subscribe": "b",
            "failOnDataLoss": "false",
            "startingOffsets": f'{{"b": {{"0": {end + 50}}}}}',
        }
    )
    with caplog.at_level(logging.WARNING, logger="pylog.spark"):
        r = opts.offset_range(view)
    assert (r.start, r.end) == (end, end)
    [record] = caplog.records
    assert f"b-0: offset {end + 50} is outside the log [0, {end}]" in record.getMessage()
    assert f"offsets {end}..{end + 49} do not exist" in record.getMessage()


def test_records_deleted_after_planning_warn_when_skipped(tmp_path: Any, caplog: Any) -> None:
    path = str(tmp_path / "log")
    make_log(path, seed=5, records=300)
    opts = Options({"path": path, "subscribe": "b", "failOnDataLoss": "false"})
    planned = opts.offset_range(LogView(path).partition("b", 0))
    with pylog.open(path) as log:
        log.alter_topic("b", retention_bytes=3000, retention_ms=-1)
        assert log.topic("b").apply_retention() > 0
        start = log.topic("b").partition(0).log_start_offset
    spec = ReadSpec(path, _offset_schema(), False, "binary", Bounds())
    with caplog.at_level(logging.WARNING, logger="pylog.spark"):
        got = [o for rb in read_range(spec, planned) for o in rb.column(0).to_pylist()]
    assert got == list(range(start, planned.end))
    [record] = caplog.records
    assert (
        f"data loss reading b-0 offsets [0, {planned.end}): offsets 0..{start - 1} were deleted"
        in record.getMessage()
    )


def _offset_schema() -> str:
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("offset", LongType())]).json()


# -- maxRecordsPerPartition (Kafka's rule: ceil(size / max) parts per range, then minPartitions) -----------


@pytest.mark.parametrize("seed", range(20))
def test_max_records_per_partition_bounds_every_split(seed: int) -> None:
    rng = random.Random(seed)
    ranges = [
        OffsetRange("t", p, s, s + rng.randint(0, 5000)) for p, s in enumerate(rng.sample(range(10_000), 5))
    ]
    most = rng.randint(1, 3000)
    minimum = rng.choice([0, rng.randint(1, 40)])
    pieces = split_ranges(ranges, minimum, most)
    assert all(0 < p.size <= most for p in pieces)
    for r in ranges:  # the pieces of each range tile it, in order
        mine = [p for p in pieces if p.partition == r.partition]
        assert [(p.start, p.end) for p in mine] == sorted((p.start, p.end) for p in mine)
        assert sum(p.size for p in mine) == r.size
        assert not mine or (mine[0].start, mine[-1].end) == (r.start, r.end)
    for group in plan_splits(ranges, minimum, {}, most):
        assert sum(p.size for p in group) <= most


def test_max_records_per_partition_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="maxrecordsperpartition must be >= 1"):
        Options({**BASE, "maxRecordsPerPartition": "0"})


# -- on a real SparkSession ------------------------------------------------------------------------------


@needs_java
def test_options_are_checked_on_a_real_session(spark: Any, log_path: str) -> None:
    def load(**options: str) -> Any:
        reader = spark.read.format("pylog")
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load(log_path)

    with pytest.raises(Exception, match="did you mean 'startingOffsets'"):
        load(subscribe="a", startingOffset="earliest").collect()
    with pytest.raises(Exception, match="give the log directory instead"):
        load(subscribe="a", **{"kafka.bootstrap.servers": "localhost:9092"}).collect()
    with pytest.raises(Exception, match="set startingOffsets to earliest or latest instead"):
        load(subscribe="a", **{"kafka.auto.offset.reset": "earliest"}).collect()
    with pytest.raises(Exception, match="option maxOffsetsPerTrigger only applies to streaming queries"):
        load(subscribe="a", maxOffsetsPerTrigger="5").collect()
    with pytest.raises(Exception, match="names topic 'aa', which this query does not read"):
        load(subscribe="a", startingOffsets='{"aa": {"0": 1}}').collect()
    with pytest.raises(Exception, match="the name of a Kafka column"):
        load(subscribe="a", valueFormat="msgpack", valueSchema="topic string").collect()
    # failOnDataLoss=false with a starting offset past the end reads from the end (and logs a warning)
    end = LogView(log_path).partition("b", 0).log_end_offset
    df = load(subscribe="b", failOnDataLoss="false", startingOffsets=f'{{"b": {{"0": {end + 10}}}}}')
    assert df.count() == 0
    # maxRecordsPerPartition splits as Kafka's source does
    df = load(subscribe="b", maxRecordsPerPartition="7")
    assert df.rdd.getNumPartitions() == -(-end // 7)
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(end))


def test_bad_pattern_is_a_config_error_when_offsets_are_checked(log_path: str) -> None:
    opts = Options({"path": log_path, "subscribePattern": "(", "startingOffsets": '{"a": {"0": 1}}'})
    with pytest.raises(ConfigError, match="subscribePattern is not a valid regex"):
        opts.check_offset_options(LogView(log_path))
