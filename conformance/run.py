"""librdkafka's own integration test suite against ``pylog serve`` (and Tansu, for comparison).

librdkafka is the engine of confluent-kafka and kcat; its ``tests/`` directory holds about 140 numbered
tests written for a real Kafka cluster. This script:

1. gets librdkafka's source (the Debian source package's tarball, checked against its SHA-256; or
   ``--source DIR`` for a tree already unpacked) into ``build/conformance/``,
2. builds the library and ``tests/test-runner`` once (``./configure && make libs && make -C tests build``),
3. runs every test that needs a broker and applies to one (tests marked local, sockem, manual or known issue
   by librdkafka itself are left out), each against a fresh broker (a new pylog log directory; a new Tansu
   in-memory broker), in quick mode (``test-runner -Q``) with a time limit per test,
4. prints a pass/fail table per test and broker, the totals, and writes the same as JSON and Markdown.

Usage (``make conformance`` runs the first form)::

    .venv/bin/python conformance/run.py                       # pylog and Tansu, every applicable test
    .venv/bin/python conformance/run.py --broker pylog --tests 0001,0017,0103
    .venv/bin/python conformance/run.py --markdown docs-table.md --timeout 300

A test that librdkafka's runner skips by itself (it needs Kafka's command-line tools, SASL, SSL, several
brokers or a newer broker version) is reported as ``SKIP`` and counted apart from passes and failures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "conformance"

# librdkafka's release whose tests are run by default, and its source archive on GitHub; "debian" takes
# Debian 12's source package instead (librdkafka 2.0.2, the library under its kcat), from Debian's mirror, for
# machines that reach that mirror and not GitHub.
DEFAULT_LIBRDKAFKA = "2.15.0"
GITHUB_URL = "https://github.com/confluentinc/librdkafka/archive/refs/tags/v{version}.tar.gz"
DEBIAN_VERSION = "2.0.2"
DEBIAN_URL = (
    f"https://deb.debian.org/debian/pool/main/libr/librdkafka/librdkafka_{DEBIAN_VERSION}.orig.tar.gz"
)
DEBIAN_SHA256 = "f321bcb1e015a34114c83cf1aa7b99ee260236aab096b85c003170c90a47ca9d"

# Flags with which librdkafka marks tests that need no broker, a socket emulator, a human, or that fail on
# Kafka itself: not part of a broker's conformance.
EXCLUDED_FLAGS = ("TEST_F_LOCAL", "TEST_F_SOCKEM", "TEST_F_MANUAL", "TEST_F_KNOWN_ISSUE")
START_TIMEOUT_S = 30.0
ANSI = re.compile(r"\x1b\[[0-9;]*m|\x1b\(B")
SUMMARY_ROW = re.compile(
    r"^\|\s*(\d{4}\w*?)\s*\|\s*(PASSED|FAILED|SKIPPED|RUNNING|NOT_STARTED)\s*\|[^|]*\|\s*(.*)$"
)


@dataclass
class Outcome:
    """One librdkafka test (a name such as ``0045_subscribe_update``) against one broker."""

    name: str
    state: str  # PASS, FAIL, SKIP (by the runner), N/A (see NOT_APPLICABLE), TIMEOUT, ERROR
    seconds: float
    reason: str = ""


@dataclass
class Run:
    broker: str
    version: str
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, state: str) -> int:
        return sum(1 for o in self.outcomes if o.state == state)


# -- the librdkafka tree ---------------------------------------------------------------------------------


def fetch_source(dest: Path, release: str) -> Path:
    """Unpack librdkafka's source (release ``X.Y.Z`` from GitHub, or ``debian``) under ``dest``, downloaded
    once; Debian's tarball is checked against its SHA-256, GitHub's is fetched over HTTPS and its SHA-256
    printed."""
    version = DEBIAN_VERSION if release == "debian" else release
    tree = dest / f"librdkafka-{version}"
    if (tree / "tests" / "test.c").is_file():
        return tree
    url = DEBIAN_URL if release == "debian" else GITHUB_URL.format(version=version)
    dest.mkdir(parents=True, exist_ok=True)
    tarball = dest / f"librdkafka-{version}.tar.gz"
    if not tarball.is_file():
        print(f"downloading {url}", flush=True)
        partial = tarball.with_suffix(".part")
        try:
            with urllib.request.urlopen(url, timeout=120) as response, open(partial, "wb") as out:
                shutil.copyfileobj(response, out)
        except OSError as exc:
            hint = (
                "" if release == "debian" else " (--librdkafka debian takes Debian's 2.0.2 from its mirror)"
            )
            raise SystemExit(f"cannot download {url}: {exc}{hint}; or pass --source DIR") from exc
        partial.rename(tarball)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if release == "debian" and digest != DEBIAN_SHA256:
        raise SystemExit(f"{tarball}: SHA-256 {digest}, expected {DEBIAN_SHA256}; delete it and retry")
    print(f"{tarball.name}: SHA-256 {digest}", flush=True)
    with tarfile.open(tarball) as tar:
        top = tar.getnames()[0].split("/")[0]
        tar.extractall(dest, filter="data")
    if top != tree.name:
        (dest / top).rename(tree)
    return tree


def library_version(tree: Path) -> str:
    """``X.Y.Z`` from the tree's ``src/rdkafka.h`` (``RD_KAFKA_VERSION 0xMMmmrrxx``)."""
    match = re.search(
        r"#define RD_KAFKA_VERSION\s+0x([0-9a-fA-F]{8})", (tree / "src" / "rdkafka.h").read_text()
    )
    if not match:
        return "?"
    n = int(match.group(1), 16)
    return f"{n >> 24}.{(n >> 16) & 0xFF}.{(n >> 8) & 0xFF}"


def build(tree: Path, jobs: int) -> Path:
    """Build librdkafka and its test runner in ``tree`` (once); return the runner."""
    runner = tree / "tests" / "test-runner"
    if runner.is_file():
        return runner
    log = tree.parent / f"build-{tree.name}.log"
    print(f"building librdkafka {library_version(tree)} and its test runner (log: {log})", flush=True)
    steps = [
        ["./configure", "--disable-gssapi", "--disable-curl", "--disable-lz4-ext"],
        ["make", f"-j{jobs}", "libs"],
        ["make", f"-j{jobs}", "-C", "tests", "build"],
    ]
    with open(log, "wb") as out:
        for argv in steps:
            if subprocess.run(argv, cwd=tree, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                tail = log.read_text(errors="replace")[-2000:]
                raise SystemExit(f"`{' '.join(argv)}` failed in {tree}:\n{tail}")
    return runner


@dataclass(frozen=True)
class Scenario:
    """The broker a librdkafka scenario expects (tests/scenarios/NAME.json: Kafka's auto.create.topics.enable
    and num.partitions; the replication factor does not apply to one broker)."""

    name: str
    auto_create: bool = True
    num_partitions: int = 4

    @classmethod
    def read(cls, tree: Path, name: str) -> Scenario:
        path = tree / "tests" / "scenarios" / f"{name}.json"
        text = path.read_text() if path.is_file() else ""  # not strict JSON (trailing commas): read two keys
        auto = re.search(r'"auto_create_topics"\s*:\s*"?(\w+)', text)
        partitions = re.search(r'"num_partitions"\s*:\s*(\d+)', text)
        return cls(
            name,
            auto_create=auto is None or auto.group(1).lower() == "true",
            num_partitions=int(partitions.group(1)) if partitions else 4,
        )


@dataclass(frozen=True)
class Test:
    """A runnable selection: test number ``number`` in librdkafka's scenario ``scenario`` (``default``, or
    ``noautocreate`` for tests that need a broker that does not create topics on Metadata)."""

    number: str
    scenario: str
    names: tuple[str, ...]


def applicable_tests(tree: Path) -> list[Test]:
    """The tests of librdkafka's table (tests/test.c) that need a broker and are not excluded by flag."""
    table = (tree / "tests" / "test.c").read_text()
    table = table[table.index("struct test tests[]") :]
    chosen: dict[tuple[str, str], list[str]] = {}
    for entry in table.split("_TEST(")[1:]:
        entry = entry.split("};")[0]  # the last entry runs to the table's end
        name = entry.split(",")[0].strip()
        if not re.fullmatch(r"\d{4}_\w+", name) or any(re.search(rf"\b{f}\b", entry) for f in EXCLUDED_FLAGS):
            continue
        scenario = re.search(r'\.scenario\s*=\s*"([^"]*)"', entry)
        scenarios = scenario.group(1).split(",") if scenario else ["default"]
        chosen.setdefault((name[:4], scenarios[0]), []).append(name)
    return [Test(number, scenario, tuple(names)) for (number, scenario), names in chosen.items()]


# -- brokers ---------------------------------------------------------------------------------------------


@contextmanager
def pylog_broker(workdir: Path, scenario: Scenario) -> Iterator[str]:
    """``pylog --dir DIR serve`` over a fresh directory, on a free port, configured as ``scenario`` says;
    yields its address."""
    argv = [
        sys.executable,
        "-m",
        "pylog.cli",
        "--dir",
        str(workdir / "log"),
        "serve",
        "--listen",
        "127.0.0.1:0",
    ]
    argv += ["--num-partitions", str(scenario.num_partitions)]
    if not scenario.auto_create:
        argv.append("--no-auto-create-topics")
    with open(workdir / "broker.log", "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=workdir)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        if not address:
            proc.wait(START_TIMEOUT_S)
            raise RuntimeError(f"pylog serve did not start: {(workdir / 'broker.log').read_text()[-1000:]}")
        yield address
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)
        if proc.stdout is not None:
            proc.stdout.close()


@contextmanager
def tansu(workdir: Path, scenario: Scenario) -> Iterator[str]:
    """Tansu with in-memory storage, started as the benchmarks start it (it has no options for topic
    auto-creation or default partitions: every scenario runs against the same broker)."""
    from benchmarks.cases.kafka import tansu_broker

    with tansu_broker(workdir) as (servers, _version):
        yield servers


def broker_version(broker: str) -> str:
    if broker == "pylog":
        out = subprocess.run([sys.executable, "-m", "pylog.cli", "--version"], capture_output=True, text=True)
        return out.stdout.split(",")[0].strip() or "pylog"
    from benchmarks.cases.kafka import _tansu_binary

    with tempfile.TemporaryDirectory() as tmp:
        binary = _tansu_binary(Path(tmp))
        return subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()


BROKERS = {"pylog": pylog_broker, "tansu": tansu}


# -- running tests ---------------------------------------------------------------------------------------


def run_one(runner: Path, broker: str, test: Test, timeout: float, logs: Path) -> list[Outcome]:
    scenario = Scenario.read(runner.parent.parent, test.scenario)
    """Run ``test`` against a fresh broker; one outcome per test name."""
    logs.mkdir(parents=True, exist_ok=True)
    label = test.number if test.scenario == "default" else f"{test.number}-{test.scenario}"
    log = logs / f"{label}.log"
    started = time.monotonic()

    def every(state: str, reason: str) -> list[Outcome]:
        return [Outcome(name, state, time.monotonic() - started, reason) for name in test.names]

    with tempfile.TemporaryDirectory(prefix=f"rdk-{broker}-{label}-") as tmp:
        workdir = Path(tmp)
        conf = workdir / "test.conf"
        try:
            with BROKERS[broker](workdir, scenario) as address:
                # librdkafka's own CI runs with the multiplier at 3 (test.c: CI adds 2 to 1.0)
                conf.write_text(f"bootstrap.servers={address}\ntest.timeout.multiplier=3\n")
                lib = runner.parent.parent
                env = dict(
                    os.environ,
                    TESTS=test.number,
                    RDKAFKA_TEST_CONF=str(conf),
                    LD_LIBRARY_PATH=f"{lib / 'src'}:{lib / 'src-cpp'}",
                )
                argv = [str(runner), "-p1", "-Q", "-E", "-K", "-L", "-s", test.scenario]
                with open(log, "wb") as out:
                    proc = subprocess.Popen(
                        argv,
                        cwd=workdir,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                    try:
                        proc.wait(timeout)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        return every(
                            "TIMEOUT",
                            f"over {timeout:.0f} s; {first_failure(log.read_text(errors='replace'))}",
                        )
            if (workdir / "broker.log").is_file() and (workdir / "broker.log").stat().st_size:
                shutil.copyfile(workdir / "broker.log", logs / f"{label}.broker.log")
        except Exception as exc:  # a broker that does not start: an error, the run goes on
            return every("ERROR", str(exc)[:300])
    return parse_summary(log.read_text(errors="replace"), test, time.monotonic() - started, proc.returncode)


# Failures that say the test needs what one broker does not have: reported as N/A, apart from failures.
# librdkafka's suite is written for a three-broker cluster with Kafka's command-line tools beside it.
NOT_APPLICABLE = {
    r"KAFKA_PATH": "needs Kafka's command-line tools (KAFKA_PATH)",
    # the broker refused the replication factor (pylog: "one node: 1"; Kafka: "Replication factor: 3 larger
    # than available brokers: 1"), not a timeout or another error of CreateTopics
    r"test_admin_create_topic\(\): .*result error: (one node|[Rr]eplication factor)": (
        "creates its topic with replication factor 3 (a three-broker cluster: one Kafka broker refuses it too)"
    ),
}

FAILURE = re.compile(r'### Test "([^"]*)" failed at ([^ ]+) at [^#]*###\n(.*)')


def first_failure(text: str) -> str:
    """The first ``TEST FAILURE`` of a runner's output: where and why."""
    match = FAILURE.search(ANSI.sub("", text))
    if not match:
        return ""
    return f"{match.group(1)} at {match.group(2)}: {match.group(3).strip()}"[:400]


def not_applicable(outcome: Outcome) -> Outcome:
    """``outcome`` as N/A when its failure is one of :data:`NOT_APPLICABLE`."""
    for pattern, reason in NOT_APPLICABLE.items():
        if outcome.reason == reason or (outcome.state == "FAIL" and re.search(pattern, outcome.reason)):
            return Outcome(outcome.name, "N/A", outcome.seconds, reason)
    return outcome


def parse_summary(text: str, test: Test, seconds: float, returncode: int) -> list[Outcome]:
    """Outcomes from the runner's summary table; a runner that aborted before it fails every name."""
    states = {"PASSED": "PASS", "FAILED": "FAIL", "SKIPPED": "SKIP", "RUNNING": "FAIL", "NOT_STARTED": "FAIL"}
    found = {}
    for line in ANSI.sub("", text).splitlines():
        row = SUMMARY_ROW.match(line.strip())
        if row and row.group(1) in test.names:
            reason = " ".join(row.group(3).split())
            found[row.group(1)] = Outcome(row.group(1), states[row.group(2)], seconds, reason[:400])
    why = first_failure(text)
    outcomes = []
    for name in test.names:
        outcome = found.get(name)
        if outcome is None:
            outcome = Outcome(
                name, "FAIL", seconds, why or f"the runner exited with {returncode} before its summary"
            )
        elif outcome.state == "PASS" and returncode != 0:
            outcome = Outcome(name, "FAIL", seconds, why or f"the runner exited with {returncode}")
        elif outcome.state == "FAIL" and why:
            outcome = Outcome(name, "FAIL", seconds, why)
        outcomes.append(not_applicable(outcome))
    return outcomes


# -- reporting -------------------------------------------------------------------------------------------


def failed(run: Run) -> int:
    return sum(run.count(s) for s in ("FAIL", "TIMEOUT", "ERROR"))


def totals_of(run: Run) -> str:
    return f"{run.count('PASS')} passed, {failed(run)} failed, {run.count('SKIP')} skipped, {run.count('N/A')} N/A"


def markdown(runs: list[Run]) -> str:
    names = sorted({o.name for run in runs for o in run.outcomes})
    by = {(run.broker, o.name): o for run in runs for o in run.outcomes}
    lines = ["| test | " + " | ".join(r.version for r in runs) + " |", "|---|" + "---|" * len(runs)]
    for name in names:
        cells = [by[(r.broker, name)].state if (r.broker, name) in by else "-" for r in runs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    totals = [totals_of(r) for r in runs]
    lines.append("| **total** | " + " | ".join(totals) + " |")
    return "\n".join(lines) + "\n"


def failure_list(runs: list[Run]) -> str:
    """Every test that did not pass, with the first failure the runner reported."""
    lines = []
    for run in runs:
        for o in run.outcomes:
            if o.state != "PASS":
                lines.append(f"- {run.broker} {o.name}: {o.state}, {o.reason or 'no reason given'}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--broker", default="pylog,tansu", help="comma-separated: pylog, tansu")
    parser.add_argument(
        "--tests", default="", help="comma-separated test numbers (default: every applicable)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test (default 300)")
    parser.add_argument(
        "--librdkafka",
        default=DEFAULT_LIBRDKAFKA,
        help=f"release whose tests run (default {DEFAULT_LIBRDKAFKA}, from GitHub), or debian (Debian 12's 2.0.2)",
    )
    parser.add_argument("--source", type=Path, help="an unpacked librdkafka source tree to use instead")
    parser.add_argument("--jobs", type=int, default=2, help="make -j for the build")
    parser.add_argument("--markdown", type=Path, help="also write the result table here")
    parser.add_argument(
        "--report",
        action="store_true",
        help="only print the table of the last results (build/conformance/*.json)",
    )
    args = parser.parse_args()
    if args.report:
        runs = []
        for broker in [b.strip() for b in args.broker.split(",") if b.strip()]:
            release = DEBIAN_VERSION if args.librdkafka == "debian" else args.librdkafka
            saved = json.loads((WORK / f"results-{broker}-{release}.json").read_text())
            outcomes = [not_applicable(Outcome(**o)) for o in saved["outcomes"]]
            runs.append(Run(saved["broker"], saved["version"], outcomes))
        print(markdown(runs))
        print(failure_list(runs), end="")
        return 0

    brokers = [b.strip() for b in args.broker.split(",") if b.strip()]
    for broker in brokers:
        if broker not in BROKERS:
            parser.error(f"unknown broker {broker!r}: pylog or tansu")
    tree = args.source.resolve() if args.source else fetch_source(WORK, args.librdkafka)
    version = library_version(tree)
    runner = build(tree, args.jobs)
    tests = applicable_tests(tree)
    chosen = {t.strip() for t in args.tests.split(",") if t.strip()}
    if chosen:
        tests = [t for t in tests if t.number in chosen]
    runs = []
    for broker in brokers:
        try:
            run = Run(broker, broker_version(broker))
        except Exception as exc:
            print(f"{broker}: not available ({exc}); left out", flush=True)
            continue
        print(
            f"== librdkafka {version}'s tests against {run.version}: {len(tests)} runs, at most {args.timeout:.0f} s each",
            flush=True,
        )
        for test in tests:
            for outcome in run_one(runner, broker, test, args.timeout, WORK / f"logs-{version}" / broker):
                run.outcomes.append(outcome)
                note = f"  {outcome.reason}" if outcome.state != "PASS" and outcome.reason else ""
                print(
                    f"{broker:6} {outcome.name:48} {outcome.state:8} {outcome.seconds:6.1f} s{note}",
                    flush=True,
                )
        runs.append(run)
        WORK.mkdir(parents=True, exist_ok=True)
        suffix = "-selected" if chosen else ""  # a run of some tests leaves the last full run's results alone
        (WORK / f"results-{broker}-{version}{suffix}.json").write_text(json.dumps(asdict(run), indent=1))
        print(f"== {run.version}: {totals_of(run)}")

    result = markdown(runs)
    print()
    print(result)
    print(failure_list(runs), end="")
    if args.markdown:
        args.markdown.write_text(result)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # benchmarks.cases.kafka starts Tansu
    sys.exit(main())
