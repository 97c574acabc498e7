"""A soak with faults: tickets through ``resolve_batch`` in several long-lived processes against the scripted
OpenAI-compatible server injecting 2% faults (connection resets, 500s, slow replies), verdicts given between
rounds and the stores compacted while they are written; then every ticket must have exactly one trace, nothing
acknowledged may be missing, open file handles stay flat, and each process's RSS growth after a warm-up stays
within 10% of what its remembered entries and documented caches account for (the RSS read after each round once
it stops falling: ``_soak_worker.settled_rss``; the span: ``span``).

Processes (each its own interpreter, ``benchmarks._soak_worker``): one per task, plus a pair on one task and one
ticket stream, which takes turns through the task's batch lock (``gil_core.batch_lock``: the second waits for the
first, then finds the round done), plus a compactor. The server runs in this process. Issue 19, "Load".

    uv run python -m benchmarks.soak --quick    # ~1,200 requests, under 2 minutes; prints only
    uv run python -m benchmarks.soak            # 50,000 requests; writes its section of RELIABILITY.md
    uv run python -m benchmarks.soak --tasks 1 --rounds 16   # longer per process (does growth level off?); prints only

With ``--keep DIR`` every process's samples stay in ``DIR/<task>/<process>.samples.jsonl``, one line per round
(resident bytes per kind of mapping, malloc's, Python's allocator's, the accounted parts'), for reading after the
run; ``--ablate`` takes parts of each worker out (``benchmarks/_soak_ablations.py``) to see which one a growth
comes with.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from benchmarks import _soak_ablations
from benchmarks._report import ROOT, Row, Section, publish
from benchmarks._soak_worker import REFUND, SETTLE_AT_LEAST_S
from gil_core.batch import ticket_trace_id
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer, ScriptedReply

SECTION = "Soak with faults"
COMMAND = "uv run python -m benchmarks.soak"
RELIABILITY_FILE = ROOT / "RELIABILITY.md"
FAULT_MIX = {"reset": 0.007, "500": 0.007, "slow": 0.006}
SLOW_SECONDS = 0.5
WARM_UP_ROUNDS = 2  # rounds whose growth is not held against the process (imports, first opens)
RSS_SLACK = 0.10
UNSPANNED_RESOLVING = "it resolved no round of its own before its last and gave no verdicts"
UNSPANNED_COMPACTION = (
    "no round of it began after the compactor had first merged its store's files and deleted its memory's old versions"
)


@dataclass(frozen=True)
class Plan:
    tasks: int  # processes with a task of their own
    rounds: int
    size: int  # tickets per round
    concurrency: int
    compact_every_s: float

    @property
    def requests(self) -> int:
        return (self.tasks + 1) * self.rounds * self.size  # the pair resolves one stream between them


QUICK = Plan(tasks=2, rounds=4, size=100, concurrency=8, compact_every_s=5.0)
FULL = Plan(tasks=4, rounds=10, size=1000, concurrency=8, compact_every_s=20.0)


class Responder:
    """The model: sure of the billing → refund-status route at every judgment; answers generation with the
    refund answer (a tree answer, so the contract holds)."""

    def __call__(self, body: Mapping[str, Any]) -> ScriptedReply:
        from tests.resolver._support import Script, SupportModel

        model = SupportModel({}, default=Script(route=["billing", "refund status"], answers=[REFUND]))
        return model(body)


@dataclass
class Worker:
    name: str
    task: str
    store: Path
    process: subprocess.Popen[str]
    acknowledged: Path
    lines: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))
                # Every sample, for reading after the run (``--keep``): more than the report shows.
                with (self.store.parent / f"{self.name}.samples.jsonl").open("a", encoding="utf-8") as kept:
                    kept.write(line)


def task_file(folder: Path, task: str, base_url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "task": task,
        "tree": str(ROOT / "ontologies" / "support.yaml"),
        "language": "en",
        "thresholds": {"per_layer": [0.6], "leaf": 0.7},
        "memory_threshold": 0.95,
        "memory_guard": True,
        "chat_model": {"url": base_url, "name": "scripted"},
        "embedding_model": "hash",
        "store": str(folder / "store"),
        "memory": str(folder / "memory"),
        "client": {"requests_per_second": 0},  # the scripted server is not rate-limited
    }
    path = folder / "task.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def start_worker(name: str, task: str, folder: Path, task_path: Path, plan: Plan, *, feedback: bool) -> Worker:
    acknowledged = folder / f"{name}.acknowledged.jsonl"
    command = [
        sys.executable, "-m", "benchmarks._soak_worker", "--task-file", str(task_path), "--rounds", str(plan.rounds),
        "--size", str(plan.size), "--concurrency", str(plan.concurrency), "--acknowledged", str(acknowledged),
        *(["--feedback"] if feedback else []),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return Worker(name, task, folder / "store", process, acknowledged)


class RequestCounter:
    """Counts the server's requests and lets go of their records (the server keeps every request it saw)."""

    def __init__(self, server: ScriptedOpenAIServer) -> None:
        self.server, self.count = server, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.take()

    def take(self) -> None:
        seen = len(self.server.requests)
        del self.server.requests[:seen]
        self.count += seen

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.take()


def run(plan: Plan, work: Path) -> dict[str, Any]:
    """Run the soak; what it measured and checked."""
    with ScriptedOpenAIServer(
        responder=Responder(), fault_mix=FAULT_MIX, fault_seed=19, slow_seconds=SLOW_SECONDS
    ) as server:
        counter = RequestCounter(server)
        tasks = [f"soak-{index}" for index in range(plan.tasks)]
        paths = {task: task_file(work / task, task, server.base_url) for task in [*tasks, "soak-pair"]}
        started = time.time()
        workers = [start_worker(t, t, work / t, paths[t], plan, feedback=True) for t in tasks]
        workers += [
            start_worker(f"soak-pair-{m}", "soak-pair", work / "soak-pair", paths["soak-pair"], plan, feedback=m == 0)
            for m in (0, 1)
        ]
        stop = work / "stop"
        compactor = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._soak_worker", "--compactor",
             *(str(work / t / "store") for t in paths), "--stop", str(stop), "--interval", str(plan.compact_every_s)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        readers = [threading.Thread(target=worker.read, daemon=True) for worker in workers]
        for reader in readers:
            reader.start()
        for worker, reader in zip(workers, readers, strict=True):
            worker.process.wait()
            reader.join()
            assert worker.process.stderr is not None
            worker.stderr = worker.process.stderr.read()
        ended = time.time()
        stop.touch()
        compacted, compactor_err = compactor.communicate(timeout=600)
        counter.stop()
        faults = dict(server.faults)
    for worker in workers:
        if worker.process.returncode != 0:
            raise SystemExit(f"{worker.name} exited {worker.process.returncode}:\n{worker.stderr[-3000:]}")
    if compactor.returncode != 0:
        raise SystemExit(f"the compactor exited {compactor.returncode}:\n{compactor_err[-3000:]}")
    passes = [json.loads(line) for line in compacted.splitlines() if line.startswith("{")]
    (work / "compactor.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passes), encoding="utf-8")
    return {
        "workers": workers,
        "wall_s": ended - started,
        "faults": faults,
        "server_requests": counter.count,
        "compactions": passes,
        "checks": check_stores(workers, plan),
    }


def check_stores(workers: Sequence[Worker], plan: Plan) -> dict[str, Any]:
    """Read back every task's store in a fresh process state: one trace per ticket, every acknowledged ticket and
    verdict there."""
    result: dict[str, Any] = {"tickets": 0, "traces": 0, "lost_tickets": 0, "lost_verdicts": 0, "verdicts": 0}
    by_task: dict[str, list[Worker]] = {}
    for worker in workers:
        by_task.setdefault(worker.task, []).append(worker)
    modes: dict[str, int] = {}
    for task, members in by_task.items():
        traces = TelemetryStore(members[0].store).read("traces").filter(pl.col("task") == task)
        expected = {ticket_trace_id(task, f"r{r}-{i}") for r in range(plan.rounds) for i in range(plan.size)}
        ids = traces.get_column("trace_id")
        assert ids.n_unique() == traces.height, f"{task}: a trace id appears twice"
        assert set(ids) == expected, (
            f"{task}: {len(expected - set(ids))} tickets without a trace, {len(set(ids) - expected)} extra"
        )
        result["tickets"] += len(expected)
        result["traces"] += traces.height
        for mode, count in traces.group_by("mode").len().iter_rows():
            modes[mode] = modes.get(mode, 0) + count
        verdicts = {
            row[0]: (row[1], row[2])
            for row in traces.select("trace_id", "feedback_verdict", "feedback_correction").iter_rows()
        }
        for member in members:
            for line in member.acknowledged.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                for ticket in entry.get("tickets", ()):
                    result["lost_tickets"] += ticket_trace_id(task, ticket) not in verdicts
                for trace_id, correct, correction in entry.get("verdicts", ()):
                    result["verdicts"] += 1
                    wanted = ("correct", None) if correct else ("wrong", correction)
                    result["lost_verdicts"] += verdicts.get(trace_id) != wanted
    result["modes"] = modes
    return result


def mib(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def first_resolving(samples: Sequence[Mapping[str, Any]]) -> int:
    """The first round the process resolved tickets in itself (its last when it never did)."""
    return next((index for index, line in enumerate(samples) if line.get("resolved")), len(samples) - 1)


def compacted_by(passes: Sequence[Mapping[str, Any]], store: str) -> float:
    """When (wall clock) the compactor had first both merged files of ``store``'s tables and deleted old versions
    of the memory beside it: the end of the later of those two passes; infinity if it never did both."""
    merged = (p["ended_at"] for p in passes if p["merged"].get(store, 0) > 0)
    pruned = (p["ended_at"] for p in passes if p.get("memory_versions_removed", {}).get(store, 0) > 0)
    return max(next(merged, math.inf), next(pruned, math.inf))


def _round_start(line: Mapping[str, Any]) -> float:
    return float(line.get("started_at", line["at"] - line["round_s"]))


def span(samples: Sequence[Mapping[str, Any]], compacted_at: float = -math.inf) -> tuple[int, int] | str:
    """The samples the growth is read between (indexes), or why there are none.

    It starts where the warm-up ends: after its rounds; once the process has resolved a round itself (the
    pair's second process may first only find rounds done, before it has imported and opened what resolving
    needs), unless it gives verdicts (the pair's first process), which is work of its own from the first round;
    and after the first round it began once the compactor had merged its store and pruned its memory
    (``compacted_at``, from ``compacted_by``): the first read over a folder a compaction left, and the first write
    after old versions went, run library code no read before them did, once per process (RELIABILITY.md,
    "Findings": the late code named). It ends at the last sample, or, for a process that gives verdicts and first
    resolved tickets in its last round (having found every other round done), at the one before: that round ran
    what no round before it did, and the rounds before it are that process's steady state."""
    end, resolving = len(samples) - 1, first_resolving(samples)
    if resolving == end and any(line.get("verdicts") for line in samples):
        end, resolving = (end - 1 if samples[end].get("resolved") else end), 0
    compacted = next((i for i, line in enumerate(samples) if _round_start(line) >= compacted_at), None)
    if compacted is None or compacted >= end:
        return UNSPANNED_COMPACTION if max(WARM_UP_ROUNDS - 1, resolving) < end else UNSPANNED_RESOLVING
    start = max(WARM_UP_ROUNDS - 1, resolving, compacted)
    return (start, end) if start < end else UNSPANNED_RESOLVING


def _python_allocator_growth(first: Mapping[str, Any], last: Mapping[str, Any]) -> int | None:
    """The growth of the bytes Python's small-object allocator has handed out, None where a sample lacks them."""
    before, after = (line.get("python_allocator", {}).get("in_use") for line in (first, last))
    return None if before is None or after is None else after - before


def growth(samples: Sequence[Mapping[str, Any]], compacted_at: float = -math.inf) -> dict[str, Any]:
    """RSS (settled: ``_soak_worker.settled_rss``; all, file-backed and anonymous) and accounted bytes over the
    ``span``; fds and threads from its start to the last sample; and, beside them, the growth as read before the
    samples waited for the RSS to settle (at the rounds' ends, from the warm-up's end to the last sample), and the
    live allocations' growth at the rounds' ends: glibc's bytes in use and the blocks Python's small-object allocator
    handed out (None without both); and the settled RSS growth with the warm-up of ``WARM_UP_ROUNDS`` rounds alone
    (not waiting for the compactor: what the soak read before it did)."""
    found = span(samples, compacted_at)
    alone = span(samples)
    start, end = (len(samples) - 1, len(samples) - 1) if isinstance(found, str) else found
    first, last = samples[start], samples[end]
    accounted = {key: last["accounted"][key] - first["accounted"][key] for key in last["accounted"]}
    named = sum(value for key, value in accounted.items() if not key.startswith("other"))
    after = samples[start:]  # open files and threads: from the warm-up's end to the last sample
    malloc = (last["malloc"] - first["malloc"]) if last.get("malloc") is not None else None
    malloc_free = (last["malloc_free"] - first["malloc_free"]) if last.get("malloc_free") is not None else None
    python = _python_allocator_growth(first, last)
    live = None if malloc is None or python is None else malloc + python
    settled = [line.get("settled", line) for line in samples]
    return {
        "warm_up": start + 1, "until": end + 1, "spanned": not isinstance(found, str),
        "unspanned": found if isinstance(found, str) else None,
        "malloc_growth": malloc, "malloc_free_growth": malloc_free, "python_allocator_growth": python,
        "live_growth": live,
        "file_growth": settled[end]["rss_file"] - settled[start]["rss_file"],
        "anon_growth": settled[end]["rss_anon"] - settled[start]["rss_anon"],
        "rss_start": settled[start]["rss"], "rss_end": settled[end]["rss"],
        "rss_growth": settled[end]["rss"] - settled[start]["rss"],
        "rss_growth_two_rounds": (
            None if isinstance(alone, str) else settled[alone[1]]["rss"] - settled[alone[0]]["rss"]
        ),
        "threads_settled": [line["threads"] for line in settled[start:] if "threads" in line],
        "round_end_growth": last["rss"] - first["rss"],
        "settle_s": [line.get("settled", {}).get("settle_s", 0.0) for line in samples],
        "rss_peak": max(line["rss"] for line in samples), "accounted_growth": named,
        "other_growth": accounted.get("other reachable from the runtime", 0),
        "fds_min": min(line["fds"] for line in after), "fds_max": max(line["fds"] for line in after),
        "fds_first": after[0]["fds"], "fds_last": after[-1]["fds"],
        "threads_max": max(line["threads"] for line in after), "threads_first": after[0]["threads"],
    }  # fmt: skip


def _memory_failures(passes: Sequence[Mapping[str, Any]]) -> str:
    """How many of the compactor's memory compactions failed, and why (each reason once)."""
    reasons = [n for p in passes for n in p["memory_merged"].values() if isinstance(n, str)]
    told = "; ".join(dict.fromkeys(reason[:160] for reason in reasons))
    count = f"{len(reasons)} memory compaction{'' if len(reasons) == 1 else 's'} failed"
    return f"{count} (tried again at the next pass){': ' + told if told else ''}"


def section(plan: Plan, measured: dict[str, Any], quick: bool, flags: str = "") -> Section:
    """The section; ``quick`` for any run other than the published one (no target on the request count), whose
    ``flags`` the command line shows."""
    workers: list[Worker] = measured["workers"]
    checks = measured["checks"]
    resolved = sum(line.get("resolved", 0) for w in workers for line in w.lines)
    warm = [line for w in workers for line in w.lines[WARM_UP_ROUNDS:]]
    warm_resolved = sum(line.get("resolved", 0) for line in warm)
    warm_start = max(w.lines[WARM_UP_ROUNDS - 1]["at"] for w in workers if w.task != "soak-pair")
    warm_end = max(w.lines[-1]["at"] for w in workers)
    held_rate = warm_resolved / max(warm_end - warm_start, 1e-9)
    # Each process pauses after each round's sample for its RSS to settle (``settled_rss``); the others run on
    # meanwhile, so the wall time above includes the pauses without being stretched by all of them.
    settling = statistics.mean(sum(s.get("settled", {}).get("settle_s", 0.0) for s in w.lines[WARM_UP_ROUNDS - 1 : -1])
                               for w in workers)  # fmt: skip
    round_rates = [
        line["resolved"] / line["resolve_s"] for line in warm if line.get("resolved") and line["resolve_s"] > 0
    ]
    faults = measured["faults"]
    pair = [w for w in workers if w.task == "soak-pair"]
    pair_waits = sum(line["waits"] for w in pair for line in w.lines)
    pair_resolved = [sum(line.get("resolved", 0) for line in w.lines) for w in pair]
    pair_done_before = sum(line.get("done_before", 0) for w in pair for line in w.lines)
    pair_skipped = sum(not line["held"] for w in pair for line in w.lines)
    passes = measured["compactions"]
    growths = {w.name: growth(w.lines, compacted_by(passes, str(w.store))) for w in workers}
    # A process that resolved no round of its own before its last and gave no verdicts (the pair's second, when it
    # found every other round done) has no growth to set against anything: it is named so, and left out.
    rss_ok = all(
        g["rss_growth"] <= (1 + RSS_SLACK) * max(g["accounted_growth"], 0) for g in growths.values() if g["spanned"]
    )
    fds_flat = all(g["fds_max"] - g["fds_min"] <= 2 and g["fds_last"] <= g["fds_first"] + 1 for g in growths.values())
    failed = sum(line.get("failed", 0) for w in workers for line in w.lines)
    crashes = [crash for w in workers for line in w.lines for crash in line.get("crashes", ())]
    rows = [
        Row("requests through `resolve_batch`", "≥ 50,000" if not quick else "(not published)", f"{resolved:,} in "
            f"{measured['wall_s']:.0f} s, {len(workers)} processes; {measured['server_requests']:,} HTTP requests "
            f"reached the server", None if quick else resolved >= 50_000),
        Row("requests/s held after the warm-up (all processes)", "—", f"{held_rate:,.1f} requests/s (wall time, "
            f"which includes each process's pauses for its RSS to settle, {settling:.0f} s in all on average; per "
            f"process and round: median {statistics.median(round_rates):,.1f}, lowest {min(round_rates):,.1f})"),
        Row("faults injected and survived", "2% of HTTP requests", f"{sum(faults.values()):,} "
            f"({sum(faults.values()) / max(measured['server_requests'], 1):.2%}): " + ", ".join(
                f"{count:,} {name}" for name, count in sorted(faults.items())) + f"; {failed:,} tickets "
            "reported failed by their batch (each still traced)", True),
        Row("batches and feedback runs that crashed (then run again)", "0", f"{len(crashes)}" + (
            ": " + "; ".join(f"{count}× `{text}`" for text, count in sorted(Counter(crashes).items())) if crashes
            else ""), not crashes),
        Row("traces per ticket", "exactly 1", f"{checks['traces']:,} traces for {checks['tickets']:,} tickets, "
            "none twice, none missing (modes: " + ", ".join(f"{m} {c:,}" for m, c in sorted(checks["modes"].items()))
            + ")", checks["traces"] == checks["tickets"]),
        Row("acknowledged and lost", "0", f"{checks['lost_tickets']} tickets, {checks['lost_verdicts']} of "
            f"{checks['verdicts']:,} verdicts", checks["lost_tickets"] == 0 and checks["lost_verdicts"] == 0),
        Row("the pair on one task (batch lock)", "takes turns or skips; one trace per ticket", f"{pair_waits} "
            f"waits for the other's turn, {pair_skipped} rounds skipped; resolved {pair_resolved[0]:,} + "
            f"{pair_resolved[1]:,} = {sum(pair_resolved):,} of {plan.rounds * plan.size:,} tickets, "
            f"{pair_done_before:,} found done by the other", sum(pair_resolved) == plan.rounds * plan.size),
        Row("open file handles after the warm-up", "flat", "; ".join(
            f"{name} {g['fds_min']}–{g['fds_max']}" for name, g in growths.items()), fds_flat),
        Row("RSS growth after the warm-up", f"within {RSS_SLACK:.0%} of entries + caches", "; ".join(
            f"{name} {mib(g['rss_growth'])} vs {mib(g['accounted_growth'])}" if g["spanned"] else
            f"{name} none measured ({g['unspanned']})" for name, g in growths.items()), rss_ok),
        Row("compactions while writing", "—", f"{len(measured['compactions'])} passes over "
            f"{len({w.task for w in workers})} stores, "
            f"{sum(sum(p['merged'].values()) for p in measured['compactions']):,} files merged; memory's tables: "
            f"{sum(n for p in measured['compactions'] for n in p['memory_merged'].values() if isinstance(n, int)):,} "
            f"data files merged, {sum(sum(p.get('memory_versions_removed', {}).values()) for p in passes):,} "
            f"versions older than {plan.compact_every_s:g} s deleted; "
            + _memory_failures(measured["compactions"])),
    ]  # fmt: skip
    curves = [
        f"| {w.name} | " + " | ".join(f"{line['rss'] / 2**20:.0f}/{line['fds']}" for line in w.lines) + " |"
        for w in workers
    ]
    width = max(len(w.lines) for w in workers)
    extra = "\n".join(
        [
            "RSS (MiB, at the round's end) / open file handles of each process after each round (the warm-up's "
            "end differs per process: the table below):",
            "",
            "| process | " + " | ".join(f"r{i + 1}" for i in range(width)) + " |",
            "|---|" + "---:|" * width,
            *curves,
        ]
    )
    accounting = "\n".join(
        [
            "What the growth after the warm-up is set against, per process, over the rounds shown (Python-reachable "
            "bytes, each object counted once, from `gc`; `other` is everything else reachable from the runtime, not "
            "counted in the target; RSS settled: sampled once it stopped falling after the round, which took the "
            "seconds shown; file-backed is the resident part of mapped files, mostly the native libraries' code, "
            "anonymous the rest; with a warm-up of rounds alone: the settled RSS growth from the end of round "
            f"{WARM_UP_ROUNDS} (the warm-up before it waited for the compactor); at the rounds' ends: the RSS growth "
            "as read before the samples waited for it to settle; threads alive at the rounds' ends and at the "
            "settled samples; malloc is glibc's bytes in use, malloc free what its arenas keep freed and not given "
            "back; Python's small objects are the bytes of the blocks its own allocator handed out, objects up to 512 "
            "bytes, in arenas outside malloc; live allocations are malloc's and those summed):",
            "",
            "| process | rounds | RSS then | RSS growth (settled) | file-backed | anonymous | with a warm-up of "
            f"{WARM_UP_ROUNDS} rounds alone | at the rounds' ends "
            "| RSS peak | settling | malloc growth | malloc free growth | Python's small objects growth "
            "| live allocations growth | entries + caches growth | other growth | threads | threads (settled) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *(
                f"| {name} | r{g['warm_up']}–r{g['until']} | {mib(g['rss_start'])} | {mib(g['rss_growth'])} | "
                f"{mib(g['file_growth'])} | {mib(g['anon_growth'])} | "
                f"{'—' if g['rss_growth_two_rounds'] is None else mib(g['rss_growth_two_rounds'])} | "
                f"{mib(g['round_end_growth'])} | "
                f"{mib(g['rss_peak'])} | {min(g['settle_s']):.1f}–{max(g['settle_s']):.1f} s | "
                + " | ".join(
                    "—" if g[k] is None else mib(g[k])
                    for k in ("malloc_growth", "malloc_free_growth", "python_allocator_growth", "live_growth")
                )
                + " | "
                f"{mib(g['accounted_growth'])} | {mib(g['other_growth'])} | {g['threads_first']}–{g['threads_max']} | "
                + (f"{min(g['threads_settled'])}–{max(g['threads_settled'])}" if g["threads_settled"] else "—")
                + " |"
                for name, g in growths.items()
            ),
        ]
    )
    last = {w.name: w.lines[-1]["accounted"] for w in workers}
    held = "; ".join(f"{name}: " + ", ".join(f"{k} {mib(v)}" for k, v in parts.items()) for name, parts in last.items())
    lead = (
        f"{len(workers)} processes, each a `Resolver` (through `open_runtime`) kept open for the whole run: "
        f"{plan.tasks} with a task of their own and a pair on one task and one ticket stream; {plan.rounds} rounds "
        f"of {plan.size:,} tickets each, each round a `resolve_batch` (concurrency {plan.concurrency}, group commit) "
        "under the task's batch turn (`hold_batch_turn_async`, 60 s wait), then verdicts on every fifth ticket of "
        "the round (one in five of those a correction; the pair's first process gives them), so every fourth "
        "ticket of the next round repeats a text memory holds. Support tree, hash embedder (no model weights), "
        "LanceDB memory with the memory guard on, request cache at its default capacity (1,000). The model is "
        "`ScriptedOpenAIServer` on loopback in the parent process with a seeded fault mix: "
        + ", ".join(f"{share:.1%} {name}" for name, share in FAULT_MIX.items())
        + f" (slow: the reply {SLOW_SECONDS:g} s late) of HTTP requests. A compactor process runs "
        f"`compact_store` over every store, and `compact_memory` over each memory table, every "
        f"{plan.compact_every_s:g} s while they are written, keeping memory's versions of the last "
        f"{plan.compact_every_s:g} s (the hourly flow keeps an hour's). Afterwards "
        "every store is read back. Samples come from each process's own `/proc/self` after each round, and again "
        "once its RSS stopped falling and no sooner than "
        f"{SETTLE_AT_LEAST_S:g} s after the round (tokio's idle I/O threads end, and jemalloc gives freed pages "
        "back, after 10 s), after a full collection of Python's cyclic garbage (the growth is read from those). "
        "Before its first round each process runs each of the store's read plans once over a scratch folder "
        "(`warm_read_plans`). The warm-up ends after "
        f"{WARM_UP_ROUNDS} rounds, once the process has resolved a round itself, and after the first round it "
        "began once the compactor had merged its store's files and deleted its memory's old versions (the first "
        "read over a compacted folder and the first write after a prune page in library code once per process); "
        "the growth is read from there to the last round (to the round before, for a process that first resolved "
        "tickets in its last round)."
    )
    notes = [f"Held at the end (bytes reachable per part): {held}.", *_live_note(growths)]
    return Section(SECTION, COMMAND + flags, lead, rows, notes, [extra, accounting])


def _live_note(growths: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The live allocations' growth against the accounted parts', and the settled anonymous growth past the live
    allocations, per process; nothing when a sample lacks the allocators' figures."""
    read = {name: g for name, g in growths.items() if g["live_growth"] is not None and g["spanned"]}
    if not read:
        return []
    live = "; ".join(
        f"{name} {mib(g['live_growth'])} against {mib(g['accounted_growth'])} + {mib(g['other_growth'])}"
        for name, g in read.items()
    )
    past = "; ".join(f"{name} {mib(g['anon_growth'] - g['live_growth'])}" for name, g in read.items())
    return [
        "Live allocations after the warm-up (glibc's bytes in use and Python's small objects, at the rounds' ends) "
        "against the entries and caches accounted for plus everything else reachable from the runtime (`other`, "
        f"which the target leaves out): {live}. The settled anonymous growth beyond the live "
        "allocations (memory the allocators hold beyond what is handed out, thread stacks, and anything allocated "
        f"outside both, such as Polars' own allocator): {past}."
    ]


def main(arguments: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small: ~1,200 requests, under 2 minutes; prints only")
    parser.add_argument(
        "--output", type=Path, help=f"write the section here (default: {RELIABILITY_FILE.name} on full runs)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--tasks", type=int, help="processes with a task of their own (a longer or smaller run "
                        "than the published one; such a run prints only, unless --output)")  # fmt: skip
    parser.add_argument("--rounds", type=int, help="rounds per process (as --tasks)")
    parser.add_argument("--compact-every", type=float, help=f"seconds between the compactor's passes (default "
                        f"{FULL.compact_every_s:g}; as --tasks)")  # fmt: skip
    parser.add_argument("--ablate", default="", help="parts of each worker taken out, comma-separated (a diagnostic: "
                        "benchmarks/_soak_ablations.py lists them); such a run prints only")  # fmt: skip
    options = parser.parse_args(arguments)
    try:
        _soak_ablations.parse(options.ablate)
    except ValueError as exc:
        parser.error(f"--ablate: {exc}")
    os.environ[_soak_ablations.ENVIRONMENT] = options.ablate
    os.environ.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    plan = QUICK if options.quick else FULL
    custom = (
        options.tasks is not None or options.rounds is not None or options.compact_every is not None
        or bool(options.ablate)
    )  # fmt: skip
    if options.rounds is not None and options.rounds <= WARM_UP_ROUNDS:
        parser.error(f"--rounds must be more than the {WARM_UP_ROUNDS} warm-up rounds")
    if custom:
        plan = dataclasses.replace(
            plan,
            tasks=options.tasks or plan.tasks,
            rounds=options.rounds or plan.rounds,
            compact_every_s=options.compact_every or plan.compact_every_s,
        )
    work = options.keep or Path(tempfile.mkdtemp(prefix="gil-soak-"))
    print(f"soak: {plan.requests:,} requests in {plan.tasks + 2} processes, work folder {work}", flush=True)
    measured = run(plan, work)
    flags = " --quick" * options.quick + (f" --tasks {plan.tasks} --rounds {plan.rounds}" if custom else "")
    flags += f" --compact-every {plan.compact_every_s:g}" if options.compact_every is not None else ""
    flags += f" --ablate {options.ablate}" if options.ablate else ""
    published = not (options.quick or custom)
    built = section(plan, measured, not published, flags)
    target = None if options.no_write else options.output or (RELIABILITY_FILE if published else None)
    publish([built], target)
    if built.misses:
        print("misses: " + "; ".join(row.what for row in built.misses), flush=True)
    if options.keep is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
