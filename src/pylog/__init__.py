"""pylog: an embeddable, partitioned, crash-safe commit log with Kafka's model.

>>> import pylog, tempfile
>>> with pylog.open(tempfile.mkdtemp()) as log:
...     _ = log.create_topic("clicks", partitions=2)
...     producer = log.producer()
...     meta = producer.send("clicks", {"page": "/"}, key="user-1").get()
...     producer.close()
...     consumer = log.consumer("clicks", auto_offset_reset="earliest", consumer_timeout_ms=0)
...     [(r.key, r.value) for r in consumer]
[(b'user-1', {'page': '/'})]
"""

from __future__ import annotations

from pylog import errors
from pylog.broker import serve
from pylog.clock import Clock, ManualClock, SystemClock
from pylog.config import TopicConfig
from pylog.consumer import Consumer
from pylog.groups.listener import ConsumerRebalanceListener
from pylog.log import Log, open_log, repair
from pylog.producer import BatchFuture, BatchResult, FutureRecordMetadata, Producer
from pylog.structs import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    RecordMetadata,
    TopicPartition,
)
from pylog.topic import Topic

open = open_log

__version__ = "0.1.0"

__all__ = [
    "BatchFuture",
    "BatchResult",
    "Clock",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "FutureRecordMetadata",
    "Log",
    "ManualClock",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "Producer",
    "RecordMetadata",
    "SystemClock",
    "Topic",
    "TopicConfig",
    "TopicPartition",
    "__version__",
    "errors",
    "open",
    "repair",
    "serve",
]
