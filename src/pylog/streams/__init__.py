"""pylog.streams: stream processing on a pylog log, with Kafka Streams' model and no broker.

>>> from pylog.streams import App, TestDriver
>>> app = App(None, "word-count")
>>> words = app.stream("lines").flat_map_values(str.split).group_by(lambda k, word: word).count(name="counts")
>>> words.to_stream().to("word-counts")
>>> driver = TestDriver(app)
>>> driver.pipe("lines", "to be or not to be")
>>> driver.store("counts").to_dict()
{'to': 2, 'be': 2, 'or': 1, 'not': 1}

See docs/streams.md for the concepts, every operation, state, exactly-once and the test driver.
"""

from __future__ import annotations

from pylog.streams.app import App
from pylog.streams.driver import TestDriver, TestRecord
from pylog.streams.dsl import (
    GlobalTable,
    GroupedStream,
    GroupedTable,
    SessionWindowedStream,
    Stream,
    Table,
    WindowedStream,
)
from pylog.streams.handlers import (
    DeadLetterHandler,
    ErrorContext,
    ProcessingResponse,
    log_and_continue,
    log_and_fail,
)
from pylog.streams.runtime import StateRestoreListener
from pylog.streams.serde import BYTES, JSON, MSGPACK, STRING, Serde
from pylog.streams.stores import KeyValueStore, SessionStore, SlidingStore, WindowStore
from pylog.streams.topology import TaskId, Topology
from pylog.streams.windows import (
    WINDOWED,
    HoppingWindows,
    JoinWindows,
    SessionWindows,
    SlidingWindows,
    TumblingWindows,
    Windowed,
)

__all__ = [
    "BYTES",
    "JSON",
    "MSGPACK",
    "STRING",
    "WINDOWED",
    "App",
    "DeadLetterHandler",
    "ErrorContext",
    "GlobalTable",
    "GroupedStream",
    "GroupedTable",
    "HoppingWindows",
    "JoinWindows",
    "KeyValueStore",
    "ProcessingResponse",
    "Serde",
    "SlidingStore",
    "SessionStore",
    "SessionWindowedStream",
    "SessionWindows",
    "SlidingWindows",
    "StateRestoreListener",
    "Stream",
    "Table",
    "TaskId",
    "TestDriver",
    "TestRecord",
    "Topology",
    "TumblingWindows",
    "WindowStore",
    "Windowed",
    "WindowedStream",
    "log_and_continue",
    "log_and_fail",
]
