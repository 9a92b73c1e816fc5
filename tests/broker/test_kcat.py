"""kcat (librdkafka's command-line client, Debian package ``kcat``) against pylog's broker, run unchanged as a
subprocess: producing with keys, headers, null keys and values and every codec; consuming from the beginning,
from an offset by timestamp, from the end; metadata listings; a consumer group whose commits pylog sees.

kcat is a system package, not a Python one: ``.ci/run`` installs it. A machine without it fails these tests
(it does not skip them) so that a CI machine missing it cannot pass unnoticed.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import string
import subprocess

import confluent_kafka as ck
import pytest
from kafka_support import WAIT_S
from kafka_support import stored as embedded_read

import pylog
from pylog.broker.broker import Broker

Line = tuple[str | None, str | None]  # (key, value); None is Kafka's null


@pytest.fixture(scope="module")
def kcat_path() -> str:
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if path is None:
        pytest.fail("kcat is not installed: run .ci/run, which installs the Debian package kcat")
    return path


def kcat(
    kcat_path: str, broker: Broker, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run kcat against ``broker``; a non-zero exit fails the test with kcat's own error output."""
    done = subprocess.run(
        [kcat_path, "-b", broker.bootstrap_servers, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, f"kcat {' '.join(args)} exited with {done.returncode}: {done.stderr[-2000:]}"
    return done


def text_lines(n: int, seed: int) -> list[Line]:
    """Keys and values kcat can carry on a line (no tab, no newline): short and long, repetitive enough to
    compress, with null keys and null values among them (empty fields, sent as null by ``kcat -Z``)."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + " .,;:-_{}[]\"'"
    out: list[Line] = []
    for i in range(n):
        key = None if i % 9 == 4 else f"key-{rng.randrange(50)}"
        value: str | None = "".join(rng.choices(alphabet, k=rng.randrange(1, 40))) * rng.randrange(1, 12)
        if i % 13 == 6 and key is not None:
            value = None
        if i == n // 2:
            value = "x" * 60_000 + "end"  # larger than one of the client's produce batches
        out.append((key, value))
    return out


def as_stdin(lines: list[Line]) -> str:
    return "".join(f"{k or ''}\t{v or ''}\n" for k, v in lines)


def to_bytes(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


FORMAT = "%p\t%o\t%k\t%s\t%h\n"  # partition, offset, key, value, headers ("h1=v1,h2=v2")


def kcat_read(
    kcat_path: str, broker: Broker, topic: str, *offsets: str
) -> list[tuple[int, int, str, str, str]]:
    """``kcat -C`` of ``topic`` to its end, from ``offsets`` (``-o beginning`` by default), with ``-Z`` so that
    null keys and values print as NULL."""
    done = kcat(
        kcat_path,
        broker,
        "-C",
        "-t",
        topic,
        *(offsets or ("-o", "beginning")),
        "-e",
        "-q",
        "-Z",
        "-f",
        FORMAT,
    )
    rows = []
    for line in done.stdout.splitlines():
        partition, offset, key, value, headers = line.split("\t")
        rows.append((int(partition), int(offset), key, value, headers))
    return rows


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_kcat_produce_every_codec(kcat_path: str, broker: Broker, codec: str) -> None:
    """``kcat -P -K -H -Z -z CODEC``: the broker stores the bytes kcat sent (read back by pylog's consumer
    and by ``kcat -C``), and kcat really compressed (its debug log names the codec of its batches; librdkafka
    sends uncompressed when a broker's Produce versions make it think the codec unsupported)."""
    lines = text_lines(400, seed=len(codec))
    headers = [("trace", "abc-1"), ("origin", "kcat")]
    done = kcat(
        kcat_path,
        broker,
        "-P",
        "-t",
        "codecs",
        "-p",
        "0",
        "-K",
        "\t",
        "-Z",
        "-z",
        codec,
        *(arg for name, value in headers for arg in ("-H", f"{name}={value}")),
        "-X",
        "acks=all",
        "-d",
        "msg",
        stdin=as_stdin(lines),
    )
    batches = re.findall(r"Produce MessageSet with \d+ message\(s\) \([^)]*, (\w+)\)", done.stderr)
    assert batches, done.stderr[-2000:]
    if codec == "none":
        assert set(batches) == {"uncompressed"}
    else:
        assert codec in batches and "not compressing" not in done.stderr, batches

    expected = [(to_bytes(k), to_bytes(v)) for k, v in lines]
    stored = embedded_read(broker.log, "codecs")
    assert [(r.key, r.value) for r in stored] == expected
    assert [r.offset for r in stored] == list(range(len(lines)))
    assert all([(h, v) for h, v in r.headers] == [(h, v.encode()) for h, v in headers] for r in stored)

    read = kcat_read(kcat_path, broker, "codecs")
    assert [(p, o) for p, o, *_ in read] == [(0, n) for n in range(len(lines))]
    header_text = ",".join(f"{h}={v}" for h, v in headers)
    assert [(k, v, h) for _, _, k, v, h in read] == [
        (k if k is not None else "NULL", v if v is not None else "NULL", header_text) for k, v in lines
    ]


def test_kcat_reads_embedded_and_kafka_client_records(kcat_path: str, broker: Broker) -> None:
    """``kcat -C -J`` reads what pylog's producer and confluent-kafka wrote: keys, values, headers, null
    value, CreateTime timestamps, offsets."""
    log = broker.log
    log.create_topic("mixed", partitions=1)
    embedded = log.producer(value_serializer=None)
    embedded.send("mixed", b"from pylog", key=b"k1", headers=[("h", b"1")]).get()
    embedded.close()
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce(
        "mixed", value=b"from confluent", key=b"k2", headers=[("h", b"2")], timestamp=1_700_000_000_123
    )
    producer.produce("mixed", value=None, key=b"k3")
    assert producer.flush(WAIT_S) == 0

    done = kcat(kcat_path, broker, "-C", "-t", "mixed", "-o", "beginning", "-e", "-q", "-J")
    got = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(m["offset"], m["key"], m["payload"]) for m in got] == [
        (0, "k1", "from pylog"),
        (1, "k2", "from confluent"),
        (2, "k3", None),
    ]
    assert [m.get("headers") for m in got] == [["h", "1"], ["h", "2"], None]
    assert got[1]["tstype"] == "create" and got[1]["ts"] == 1_700_000_000_123


def test_kcat_metadata_listing(kcat_path: str, broker: Broker) -> None:
    """``kcat -L`` and ``-L -J``: one broker (the advertised address), every topic with its partitions, each
    led by that broker."""
    broker.log.create_topic("three", partitions=3)
    broker.log.create_topic("one", partitions=1)
    listing = json.loads(kcat(kcat_path, broker, "-L", "-J").stdout)
    host, port = broker.bootstrap_servers.rsplit(":", 1)
    assert [b["name"] for b in listing["brokers"]] == [f"{host}:{port}"]
    (broker_id,) = [b["id"] for b in listing["brokers"]]
    assert listing["controllerid"] == broker_id
    topics = {t["topic"]: t for t in listing["topics"]}
    assert {"three", "one"} <= set(topics)
    for name, count in (("three", 3), ("one", 1)):
        assert "error" not in topics[name]
        partitions = sorted(topics[name]["partitions"], key=lambda p: p["partition"])
        assert [p["partition"] for p in partitions] == list(range(count))
        assert {p["leader"] for p in partitions} == {broker_id}
        assert all(
            p["replicas"] == [{"id": broker_id}] and p["isrs"] == [{"id": broker_id}] for p in partitions
        )

    text = kcat(kcat_path, broker, "-L", "-t", "three").stdout
    assert "1 brokers:" in text and 'topic "three" with 3 partitions:' in text
    assert 'topic "one"' not in text


def test_kcat_consumer_group(kcat_path: str, broker: Broker) -> None:
    """``kcat -G``: a Kafka consumer group over three partitions reads every record once, its commits are
    pylog's group offsets, and a second run of the group resumes after them."""
    log = broker.log
    log.create_topic("grouped", partitions=3)
    producer = log.producer(value_serializer=None)
    first = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(60)]
    futures = [producer.send("grouped", value, key=key) for key, value in first]
    producer.flush()
    ends: dict[pylog.TopicPartition, int] = {}
    for future in futures:
        meta = future.get()
        tp = pylog.TopicPartition("grouped", meta.partition)
        ends[tp] = max(ends.get(tp, 0), meta.offset + 1)
    assert len(ends) == 3  # the keys spread over every partition

    def group_run() -> list[tuple[int, int, str, str]]:
        done = kcat(
            kcat_path,
            broker,
            "-G",
            "kcat-group",
            "grouped",
            "-X",
            "auto.offset.reset=earliest",
            "-e",
            "-q",
            "-f",
            "%p\t%o\t%k\t%s\n",
        )
        rows = [line.split("\t") for line in done.stdout.splitlines()]
        return [(int(p), int(o), k, v) for p, o, k, v in rows]

    got = group_run()
    assert sorted((k, v) for *_, k, v in got) == sorted((k.decode(), v.decode()) for k, v in first)
    committed = log.group_offsets("kcat-group")
    assert {tp: om.offset for tp, om in committed.items()} == ends

    second = [(f"k{i}".encode(), f"late{i}".encode()) for i in range(60, 70)]
    for key, value in second:
        producer.send("grouped", value, key=key)
    producer.close()
    resumed = group_run()
    assert sorted((k, v) for *_, k, v in resumed) == sorted((k.decode(), v.decode()) for k, v in second)


def test_kcat_offsets_by_timestamp(kcat_path: str, broker: Broker) -> None:
    """``-o s@TS`` starts at the first record at or after TS, ``-o e@TS`` stops before it, ``-Q`` answers the
    offset of a timestamp (-1 past the last record), ``-o -N`` reads the last N records."""
    base = 1_700_000_000_000
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(10):
        producer.produce("timed", value=b"v%d" % i, key=b"k%d" % i, timestamp=base + 1000 * i, partition=0)
    assert producer.flush(WAIT_S) == 0

    def offsets(*args: str) -> list[int]:
        return [o for _, o, *_ in kcat_read(kcat_path, broker, "timed", *args)]

    assert offsets("-o", f"s@{base + 3000}") == list(range(3, 10))
    assert offsets("-o", f"s@{base + 3500}") == list(range(4, 10))
    done = kcat(
        kcat_path, broker, "-C", "-t", "timed", "-o", f"s@{base + 3500}", "-o", f"e@{base + 6000}", "-q"
    )
    assert done.stdout.split() == ["v4", "v5"]
    assert offsets("-o", "-2") == [8, 9]

    assert kcat(kcat_path, broker, "-Q", "-t", f"timed:0:{base + 6500}").stdout.split() == [
        "timed",
        "[0]",
        "offset",
        "7",
    ]
    assert kcat(kcat_path, broker, "-Q", "-t", f"timed:0:{base + 99_000}").stdout.split()[-1] == "-1"


def test_kcat_offset_out_of_range_is_reset(kcat_path: str, broker: Broker) -> None:
    """``kcat -C -o 50`` on a topic of 3 records: the broker answers OFFSET_OUT_OF_RANGE and kcat resets to the
    earliest offset (``auto.offset.reset=earliest``) and reads the 3 records (librdkafka's conformance test 0034
    does the same with ``latest``)."""
    broker.log.create_topic("short", partitions=1)
    producer = broker.log.producer(value_serializer=None)
    for i in range(3):
        producer.send("short", b"v%d" % i, partition=0)
    producer.close()
    reset = ["-X", "auto.offset.reset=earliest", "-f", "%o\n"]
    done = subprocess.run(
        [
            kcat_path,
            "-b",
            broker.bootstrap_servers,
            "-C",
            "-t",
            "short",
            "-p",
            "0",
            "-o",
            "50",
            "-e",
            "-q",
            *reset,
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "1", "2"]
