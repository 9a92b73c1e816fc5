"""``pylog.testing`` is a feature for users: everything but its Hypothesis strategies works on a plain
``pip install pylog``, and the strategies say which extra to install when Hypothesis is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

import pylog
from pylog import fs, testing
from pylog.errors import LogClosedError
from pylog.testing import FaultyFileSystem, records, topic_configs, workloads

ROOT = Path(__file__).resolve().parents[2]

# Runs with Hypothesis made unimportable; prints what worked and what each strategy raised, as JSON.
_WITHOUT_HYPOTHESIS = """
import json, os, sys
sys.modules["hypothesis"] = None
import pylog
from pylog import fs
from pylog import testing
from pylog.testing import Append, FaultyFileSystem, Flush, TopicModel, apply_step, check_invariants

root = os.path.join(sys.argv[1], "log")
with pylog.open(root) as log:
    log.create_topic("t")
model = TopicModel("t", 1)
with fs.install(FaultyFileSystem(root)), pylog.open(root) as log:
    for step in [Append(0, ((b"k", b"v", (), 1_000),)), Flush(0)]:
        apply_step(log, "t", step, model)
state = check_invariants(root, model.acked_records(), model.durable_records())
raised = {}
for name in ("records", "topic_configs", "workloads"):
    try:
        getattr(testing, name)()
    except ImportError as exc:
        raised[name] = [type(exc).__name__, exc.name, str(exc)]
print(json.dumps({"records": len(state.partitions[("t", 0)][2]), "raised": raised}))
"""


def _run_without_hypothesis(tmp_path: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(
        [sys.executable, "-c", _WITHOUT_HYPOTHESIS, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    result: dict[str, Any] = json.loads(r.stdout.splitlines()[-1])
    return result


def test_everything_but_the_strategies_works_without_hypothesis(tmp_path: Path) -> None:
    result = _run_without_hypothesis(tmp_path)
    assert result["records"] == 1


def test_each_strategy_names_the_extra_when_hypothesis_is_missing(tmp_path: Path) -> None:
    raised = _run_without_hypothesis(tmp_path)["raised"]
    assert set(raised) == {"records", "topic_configs", "workloads"}
    for kind, module, message in raised.values():
        assert (kind, module) == ("ModuleNotFoundError", "hypothesis")
        assert "pip install 'pylog[testing]'" in message


# The public names of pylog.testing: users' harnesses import them, so the set only grows on purpose.
PUBLIC_NAMES = {
    "MUTATING_OPS",
    "POWER_LOSS_MODES",
    "AdvanceClock",
    "Append",
    "ApplyRetention",
    "FaultyFileSystem",
    "Flush",
    "Headers",
    "InvariantViolation",
    "LogState",
    "ManualClock",
    "Op",
    "PartitionKey",
    "PowerLossMode",
    "PowerLossReport",
    "Record",
    "Roll",
    "SimulatedCrash",
    "Step",
    "TopicModel",
    "TruncateTo",
    "apply_step",
    "batch_records",
    "check_invariants",
    "check_open_log",
    "corrupt_segment",
    "crash_and_reopen",
    "encode_records",
    "log_state",
    "merge_expectations",
    "records",
    "topic_configs",
    "workloads",
}

# Imports pylog.testing in a fresh interpreter (Hypothesis installed) and prints what that loaded, as JSON.
_IMPORT_ONLY = """
import json, sys
import pylog.testing
print(json.dumps({
    "all": pylog.testing.__all__,
    "hypothesis": sorted(m for m in sys.modules if m.split(".")[0] == "hypothesis"),
    "strategies": "pylog.testing.strategies" in sys.modules,
}))
"""


def test_importing_pylog_testing_does_not_import_hypothesis() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(
        [sys.executable, "-c", _IMPORT_ONLY], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["hypothesis"] == []
    assert result["strategies"] is False
    assert set(result["all"]) == PUBLIC_NAMES


def test_the_public_names_are_exactly_the_contract() -> None:
    assert set(testing.__all__) == PUBLIC_NAMES
    assert len(testing.__all__) == len(PUBLIC_NAMES)
    for name in PUBLIC_NAMES:
        assert getattr(testing, name) is not None


def test_the_testing_extra_installs_hypothesis() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["testing"]
    assert any(req.replace(" ", "").startswith("hypothesis>=") for req in extra)


@settings(max_examples=50, deadline=None)
@given(r=records(max_key=4, max_value=8, min_ts=10, max_ts=20))
def test_records_keep_their_bounds(r: Any) -> None:
    key, value, headers, ts = r
    assert key is not None or value is not None
    assert len(key or b"") <= 4 and len(value or b"") <= 8 and 10 <= ts <= 20
    assert len(headers) <= 2


@settings(max_examples=20, deadline=None)
@given(config=topic_configs(segment_bytes=1_000), steps=workloads(partitions=3, max_steps=8))
def test_configs_and_workloads_keep_their_bounds(config: Any, steps: Any) -> None:
    assert config.segment_bytes == 1_000
    assert len(steps) <= 8
    assert all(getattr(step, "partition", 0) in range(3) for step in steps)


def test_a_log_that_died_with_its_process_never_closes_the_descriptors_of_the_next(tmp_path: Path) -> None:
    """A power cut closes the descriptors of the logs open through the layer, and their numbers are reused by
    the logs opened next: closing the dead log afterwards must not close those (as a dead process closes
    nothing), and the log is no longer open."""
    root = str(tmp_path / "log")
    with pylog.open(root) as log:
        log.create_topic("t")
    layer = FaultyFileSystem(root)
    with fs.install(layer):
        dead = pylog.open(root)
        dead.producer().send("t", b"before").get()
        layer.power_loss("process_kill")
        with pylog.open(root) as alive:
            assert dead.closed
            dead.close()
            alive.producer().send("t", b"after").get()
            consumer = alive.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
            assert [r.value for r in consumer] == [b"before", b"after"]
            consumer.close()
    with pytest.raises(LogClosedError):
        dead.topic("t")


_DEAD_LOG_AT_EXIT = """
import sys
import pylog
from pylog import fs
from pylog.testing import FaultyFileSystem

with pylog.open(sys.argv[1]) as log:
    log.create_topic("t")
layer = FaultyFileSystem(sys.argv[1])
with fs.install(layer):
    dead = pylog.open(sys.argv[1])
    layer.power_loss("drop_unsynced")
print("done")
"""


def test_a_log_that_died_with_its_process_is_not_closed_at_exit(tmp_path: Path) -> None:
    """The interpreter's exit closes the logs still open, but not one whose process "died" in a power cut:
    nothing is printed (before, each such log printed 'closing ... at exit failed: Bad file descriptor')."""
    r = subprocess.run(
        [sys.executable, "-c", _DEAD_LOG_AT_EXIT, str(tmp_path / "log")], capture_output=True, text=True
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "done\n", "")
