"""The broker's metrics in Prometheus' text format (``--metrics HOST:PORT``, ``GET /metrics``).

Names follow Kafka's JMX metrics as Prometheus' JMX exporter spells them:

| metric | type | labels | Kafka's |
|---|---|---|---|
| ``kafka_network_requestmetrics_requests_total`` | counter | request | RequestMetrics RequestsPerSec |
| ``kafka_network_requestmetrics_totaltime_seconds`` | histogram | request | RequestMetrics TotalTimeMs |
| ``kafka_network_requestmetrics_errors_total`` | counter | request, error | RequestMetrics ErrorsPerSec (per partition for Produce and Fetch) |
| ``kafka_server_brokertopicmetrics_bytesin_total`` | counter | topic | BrokerTopicMetrics BytesInPerSec (record bytes produced) |
| ``kafka_server_brokertopicmetrics_bytesout_total`` | counter | topic | BrokerTopicMetrics BytesOutPerSec (record bytes fetched) |
| ``kafka_server_socket_server_metrics_connection_count`` | gauge | | socket-server-metrics connection-count |
| ``kafka_server_socket_server_metrics_successful_authentication_total`` | counter | | successful-authentication-total |
| ``kafka_server_socket_server_metrics_failed_authentication_total`` | counter | | failed-authentication-total |
| ``pylog_connections_closed_total`` | counter | limit (``request_read_timeout_ms``, ``connections_max_idle_ms``, ``max_request_bytes``) | connections the broker closed for that limit (Kafka counts idle closes in its Selector) |
| ``kafka_server_quota_throttle_time_seconds_total`` | counter | quota (produce, fetch), user, client_id | Produce/Fetch throttle-time per quota entity |
| ``kafka_server_quota_throttled_responses_total`` | counter | quota, user, client_id | responses sent with a throttle time |
| ``kafka_server_quota_bytes_total`` | counter | quota, user, client_id | Produce/Fetch byte-rate per quota entity (record bytes counted against a quota) |
| ``pylog_group_state`` | gauge | group, state | 1 for the group's state (Empty, PreparingRebalance, CompletingRebalance, Stable) |
| ``pylog_group_lag`` | gauge | group, topic, partition | log end offset minus the group's committed offset |
| ``kafka_coordinator_group_groupmetadatamanager_numgroups`` | gauge | | GroupMetadataManager NumGroups |
| ``kafka_coordinator_group_groupmetadatamanager_numgroupsstable`` (``...preparingrebalance``, ``...completingrebalance``, ``...empty``, ``...dead``) | gauge | | NumGroupsStable, ... (of the groups described) |

The quota series are labelled with the entity whose clients share the quota (:mod:`pylog.broker.quotas`):
``user`` and ``client_id`` are empty when the entity does not name that part; only clients under a quota
appear. The group series are computed at each scrape (:func:`group_series`) from the broker's groups and the
log's group stores: one group-store read (under its lock) and one log end offset per partition with a committed
offset, for at most :data:`MAX_SCRAPED_GROUPS` groups (those beyond are counted in
``pylog_group_scrape_skipped``, not described), so a scrape costs at most about that many small file reads.

Nothing in them names a record's content or a credential; topic, group, user and client ids are label values
(escaped).

Thread-safety: updates come from the event loop and reads from the HTTP thread, under one lock; collectors
run in the HTTP thread, outside it.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final

from pylog.errors import PylogError

if TYPE_CHECKING:
    from pylog.log import Log

__all__ = ["API_NAMES", "MAX_SCRAPED_GROUPS", "BrokerMetrics", "MetricsServer", "Sample", "group_series"]

_log = logging.getLogger("pylog.broker")
MAX_SCRAPED_GROUPS: Final = 1000
Sample = tuple[str, dict[str, str], float]  # a gauge: name, labels, value
Collector = Callable[[], Iterable[Sample]]

_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
API_NAMES: Final = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
    19: "CreateTopics",
    20: "DeleteTopics",
    22: "InitProducerId",
    24: "AddPartitionsToTxn",
    25: "AddOffsetsToTxn",
    26: "EndTxn",
    28: "TxnOffsetCommit",
    32: "DescribeConfigs",
    37: "CreatePartitions",
    29: "DescribeAcls",
    30: "CreateAcls",
    31: "DeleteAcls",
    17: "SaslHandshake",
    18: "ApiVersions",
    36: "SaslAuthenticate",
    43: "ElectLeaders",
    45: "AlterPartitionReassignments",
    46: "ListPartitionReassignments",
    48: "DescribeClientQuotas",
    49: "AlterClientQuotas",
    50: "DescribeUserScramCredentials",
    51: "AlterUserScramCredentials",
    60: "DescribeCluster",
}
_REQ: Final = "kafka_network_requestmetrics"
_GROUPS: Final = "kafka_coordinator_group_groupmetadatamanager"
_STATES: Final = ("Stable", "PreparingRebalance", "CompletingRebalance", "Empty", "Dead")
_SOCK: Final = "kafka_server_socket_server_metrics"


class BrokerMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        self._histograms: dict[str, list[float]] = {}  # request -> bucket counts, then sum, then count
        self.connections = 0
        self._collectors: list[Collector] = []

    def add_collector(self, collector: Collector) -> None:
        """``collector()`` is called at each scrape (in the HTTP thread) for gauges computed then."""
        with self._lock:
            self._collectors.append(collector)

    def quota_bytes(self, quota: str, user: str, client_id: str, nbytes: int, throttle_ms: int) -> None:
        """``nbytes`` counted against the ``quota`` (produce, fetch) of the entity (``user``, ``client_id``),
        its response throttled ``throttle_ms`` (0: not throttled)."""
        labels = {"quota": quota, "user": user, "client_id": client_id}
        self.add("kafka_server_quota_bytes_total", nbytes, **labels)
        if throttle_ms:
            self.add("kafka_server_quota_throttle_time_seconds_total", throttle_ms / 1000, **labels)
            self.add("kafka_server_quota_throttled_responses_total", 1.0, **labels)

    def add(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0.0) + value

    def connection(self, delta: int) -> None:
        with self._lock:
            self.connections += delta

    def request(self, request: str, seconds: float) -> None:
        self.add(f"{_REQ}_requests_total", request=request)
        with self._lock:
            h = self._histograms.setdefault(request, [0.0] * (len(_BUCKETS) + 2))
            for i, bound in enumerate(_BUCKETS):
                if seconds <= bound:
                    h[i] += 1
            h[-2] += seconds
            h[-1] += 1

    def render(self) -> str:
        out: list[str] = []
        with self._lock:
            collectors = list(self._collectors)
        gauges: dict[str, list[tuple[dict[str, str], float]]] = {}
        for collector in collectors:
            try:
                for name, labels, value in collector():
                    gauges.setdefault(name, []).append((labels, value))
            except Exception:  # a scrape must still answer what it can
                _log.exception("a metrics collector failed")
        for name, series in sorted(gauges.items()):
            out.append(f"# TYPE {name} gauge")
            for labels, value in series:
                out.append(f"{name}{_labels(tuple(sorted(labels.items())))} {_num(value)}")
        with self._lock:
            out.append(f"# TYPE {_SOCK}_connection_count gauge")
            out.append(f"{_SOCK}_connection_count {self.connections}")
            for name in sorted(self._counters):
                out.append(f"# TYPE {name} counter")
                for key, value in sorted(self._counters[name].items()):
                    out.append(f"{name}{_labels(key)} {_num(value)}")
            name = f"{_REQ}_totaltime_seconds"
            out.append(f"# TYPE {name} histogram")
            for request, h in sorted(self._histograms.items()):
                for bound, count in zip(_BUCKETS, h, strict=False):
                    out.append(f'{name}_bucket{{le="{bound}",request="{_escape(request)}"}} {_num(count)}')
                out.append(f'{name}_bucket{{le="+Inf",request="{_escape(request)}"}} {_num(h[-1])}')
                out.append(f'{name}_sum{{request="{_escape(request)}"}} {h[-2]}')
                out.append(f'{name}_count{{request="{_escape(request)}"}} {_num(h[-1])}')
        return "\n".join(out) + "\n"


def _labels(key: tuple[tuple[str, str], ...]) -> str:
    if not key:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in key) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def group_series(
    log: Log, live: Callable[[], Mapping[str, str]], max_groups: int = MAX_SCRAPED_GROUPS
) -> list[Sample]:
    """``pylog_group_state``, ``pylog_group_lag`` and Kafka's group counts of the log's groups (see the module
    docstring). ``live()``: the state of each group with Kafka members in the broker (the others' states are
    those of their group stores, where pylog consumers keep them)."""
    states = dict(live())
    ids = sorted(set(log.list_groups()) | set(states))
    out: list[Sample] = [
        ("pylog_group_scrape_skipped", {}, float(max(len(ids) - max_groups, 0))),
        (f"{_GROUPS}_numgroups", {}, float(len(ids))),
    ]
    counts = dict.fromkeys(_STATES, 0)
    for group in ids[:max_groups]:
        state = states.get(group)
        try:
            if state is None:
                state = log.describe_group(group).state
            offsets = log.group_offsets(group)
        except PylogError as exc:  # deleted meanwhile, or its files do not check: left out
            _log.warning("metrics: group %r left out: %s", group, exc)
            continue
        counts[state] = counts.get(state, 0) + 1
        out.append(("pylog_group_state", {"group": group, "state": state}, 1.0))
        for tp, committed in offsets.items():
            try:
                end = log.topic(tp.topic).partition(tp.partition).log_end_offset
            except PylogError:  # offsets of a topic or partition deleted since: no lag to show
                continue
            labels = {"group": group, "topic": tp.topic, "partition": str(tp.partition)}
            out.append(("pylog_group_lag", labels, float(max(end - committed.offset, 0))))
    for state, count in counts.items():
        out.append((f"{_GROUPS}_numgroups{state.lower()}", {}, float(count)))
    return out


class MetricsServer:
    """``GET /metrics`` on (host, port) from a thread of its own; :meth:`close` stops it."""

    def __init__(self, metrics: BrokerMetrics, host: str, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host if ":" not in host else f"[{host}]"
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="pylog-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
