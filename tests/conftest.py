"""Fixtures shared by every test, and what keeps the suite independent of the machine and of test order.

- Each test runs in an empty working directory of its own and without ``PYLOG_*`` variables from the
  environment, so no test reads or writes the checkout, ``./pylog-data`` or another test's files. A test
  that leaves a file in its working directory fails: pylog writes only where it is told to.
- Hypothesis keeps no example database by default (a run does not depend on earlier runs) and prints the
  blob that reproduces a failure; ``HYPOTHESIS_PROFILE=dev`` keeps the database in ``.hypothesis/`` of the
  checkout instead. Its other files go to a temporary directory.
- Ctrl-C (SIGINT) is handled as Python does by default even when pytest was started with it ignored, so the
  processes that tests interrupt behave the same however the suite was launched.
- ``--order=reverse`` or ``--order=random[:SEED]`` runs the collected tests in reverse or shuffled order, to
  show that no test depends on another having run first (``random`` prints the seed it chose).
- ``moto_s3``: one S3-protocol server on loopback (moto's server mode) for the session, shared by the tests of
  tiered storage that need a real S3 endpoint (Spark's Python workers included); ``s3_remote``: an empty
  prefix of its bucket of each test's own, as ``(url, options)``; ``remote``: the same, or an empty
  ``file://`` directory (a test that takes it runs once on each).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis.database import DirectoryBasedExampleDatabase

import pylog

ROOT = Path(__file__).resolve().parents[1]
ISOLATED_ENV = ("PYLOG_DIR", "PYLOG_DEBUG", "PYLOG_BENCH_COLD")

# No timing check: the suite runs beside other CPU-bound work (CI, two busy processes), where a draw can wait
# seconds for a core; a slow example is not a failing one. Deadlines and the too-slow check are off in every
# profile; a test that sets its own suppress_health_check list replaces this one, so it names too_slow too.
TIMING_CHECKS = [hypothesis.HealthCheck.too_slow]
hypothesis.settings.register_profile(
    "pylog", database=None, print_blob=True, deadline=None, suppress_health_check=TIMING_CHECKS
)
hypothesis.settings.register_profile(
    "dev",
    database=DirectoryBasedExampleDatabase(str(ROOT / ".hypothesis" / "examples")),
    print_blob=True,
    deadline=None,
    suppress_health_check=TIMING_CHECKS,
)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "pylog"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--order",
        default="file",
        help="file (default), reverse, or random[:SEED]: the order the collected tests run in",
    )


def pytest_configure(config: pytest.Config) -> None:
    order = config.getoption("--order")
    if order == "random":
        config.option.order = f"random:{random.SystemRandom().randrange(2**32)}"
    elif order not in ("file", "reverse") and not _is_seeded(order):
        raise pytest.UsageError(f"--order must be file, reverse, random or random:SEED, not {order!r}")
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started with Ctrl-C ignored (nohup, `&` in a script): the processes the tests interrupt would
        # inherit that and ignore SIGINT too. Tests run as if started from a terminal.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    home = tempfile.mkdtemp(prefix="pylog-tests-hypothesis-")
    hypothesis.configuration.set_hypothesis_home_dir(home)
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))


def _is_seeded(order: str) -> bool:
    kind, _, seed = order.partition(":")
    return kind == "random" and seed.isdigit()


def pytest_report_header(config: pytest.Config) -> str:
    return f"test order: {config.getoption('--order')}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = config.getoption("--order")
    if order == "reverse":
        items.reverse()
    elif order.startswith("random:"):
        random.Random(int(order.partition(":")[2])).shuffle(items)


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An empty working directory and no ``PYLOG_*`` settings from outside; fails a test that leaves files
    in its working directory."""
    for name in ISOLATED_ENV:
        monkeypatch.delenv(name, raising=False)
    cwd = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(cwd)
    yield
    left = sorted(os.listdir(cwd))
    assert not left, f"files left in the working directory: {left}"


@pytest.fixture
def log_dir(tmp_path: os.PathLike[str]) -> str:
    return os.path.join(os.fspath(tmp_path), "log")


@pytest.fixture
def clock() -> pylog.ManualClock:
    return pylog.ManualClock(1_700_000_000_000)


@pytest.fixture
def log(log_dir: str, clock: pylog.ManualClock) -> Iterator[pylog.Log]:
    with pylog.open(log_dir, clock=clock) as opened:
        yield opened


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[tuple[str, dict[str, object]]]:
    """``(bucket, options)``: an empty bucket on a moto S3 server on 127.0.0.1 (an ephemeral port, started
    in this process: Spark's Python workers reach it too), and the ``remote_storage_options`` for it (fast
    retries). Skipped, with the reason, when moto's server mode is not installed."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        pytest.skip(f"moto's server mode is not installed (pip install 'moto[server]'): {exc}")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = "pylog-tests"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")).close()
    fast = {"init_backoff": timedelta(milliseconds=1), "max_backoff": timedelta(milliseconds=5), "base": 2}
    options: dict[str, object] = {
        "endpoint": endpoint,
        "region": "us-east-1",
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "client_options": {"allow_http": True},
        "retry_config": {"max_retries": 2, "backoff": fast},
    }
    yield bucket, options
    server.stop()


@pytest.fixture
def s3_remote(moto_s3: tuple[str, dict[str, object]]) -> tuple[str, dict[str, Any]]:
    """``(url, options)``: an empty prefix of ``moto_s3``'s bucket that no other test uses (a random name)."""
    bucket, options = moto_s3
    return f"s3://{bucket}/{uuid.uuid4().hex}", dict(options)


@pytest.fixture(params=["file", "s3"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """``(url, options)`` of an empty object store: a ``file://`` directory, or a fresh prefix on moto
    (``s3_remote``); a test that takes it runs on both."""
    if request.param == "file":
        return (tmp_path / "remote").as_uri(), {}
    url, options = request.getfixturevalue("s3_remote")
    return str(url), dict(options)
