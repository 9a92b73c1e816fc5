"""The subscription shared by a consumer and its group member: assignment changes keep or drop positions,
pauses and fetched records; the listener hooks; and the member's module knows nothing of the consumer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pylog.groups.member
from pylog.errors import ConfigError
from pylog.structs import TopicPartition
from pylog.subscription import Subscription

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)


def test_assign_keeps_positions_of_kept_partitions_and_drops_the_rest() -> None:
    dropped: list[TopicPartition] = []
    sub = Subscription()
    sub.bind(dropped.append, sub.positions.get)
    sub.assign([B, A])
    assert sub.assigned == [A, B] and sub.positions == {A: None, B: None}
    sub.seek(A, 5)
    sub.paused.update({A, B})
    dropped.clear()
    sub.assign([A, C])
    assert sub.assigned == [A, C]
    assert sub.positions == {A: 5, C: None}
    assert sub.paused == {A}
    assert dropped == [B]
    assert sub.fetchable() == [C]
    sub.revoke_all()
    assert sub.assigned == [] and sub.positions == {} and sub.paused == set()


def test_consumed_positions_come_from_the_owner_hook() -> None:
    sub = Subscription()
    sub.bind(lambda tp: None, lambda tp: {A: 7}.get(tp))
    sub.assign([A, B])
    assert sub.consumed_positions() == {A: 7}


def test_subscribe_returns_the_previous_subscription_to_restore() -> None:
    sub = Subscription()
    previous = sub.subscribe(["t"], None, None)
    assert sub.subscribed and sub.topics == {"t"}
    sub.subscribe([], re.compile("u.*"), None)
    assert sub.pattern_text == "u.*"
    sub.restore(previous)
    assert not sub.subscribed
    sub.subscribe(["t"], None, None)
    sub.unsubscribe()
    assert not sub.subscribed


def test_listener_hooks() -> None:
    calls: list[tuple[str, list[TopicPartition]]] = []

    class OnlyRevoked:
        def on_partitions_revoked(self, tps: list[TopicPartition]) -> None:
            calls.append(("revoked", tps))

        def on_partitions_assigned(self, tps: list[TopicPartition]) -> None:
            calls.append(("assigned", tps))

    sub = Subscription()
    sub.call_listener("on_partitions_assigned", {B, A})  # no listener: nothing
    sub.subscribe(["t"], None, OnlyRevoked())
    sub.check_listener()
    sub.call_listener("on_partitions_assigned", {B, A})
    sub.call_listener("on_partitions_lost", {C})  # falls back on on_partitions_revoked, as Kafka's default
    assert calls == [("assigned", [A, B]), ("revoked", [C])]
    sub.subscribe(["t"], None, object())
    with pytest.raises(ConfigError, match="on_partitions_revoked"):
        sub.check_listener()


def test_the_group_member_does_not_import_the_consumer() -> None:
    tree = ast.parse(Path(pylog.groups.member.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert "pylog.consumer" not in imported
    source = Path(pylog.groups.member.__file__).read_text()
    assert re.search(r"consumer\._", source) is None
