"""Reading the shadow index off a large log (part B): ``Feedback.shadows`` on a store of many judged traces, which
reads only the traces that can make a shadow (a generated answer judged, or any answer marked wrong), against the
read it replaced, every judged trace of the task (the baseline, written out here as it was). Each arm runs in a
fresh process of its own (its peak RSS is the read's), the arms alternated; both must give the same index."""

from __future__ import annotations

import json
import random
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks._report import Row, Section, support_tree

__all__ = ["ShadowFigures", "measure_shadow_read", "shadow_section"]

SECTION = "Speed: the shadow index off a large log (part B)"
GENERATED = 0.012  # shares of the log as in the soak's traces: generated answers, memory hits, the rest habits
MEMORY = 0.18
WRONG = 0.02  # verdicts saying wrong
ARMS = {"every judged trace (the read before)": "every", "only the traces that can make a shadow": "shadows"}


@dataclass
class ShadowFigures:
    traces: int
    runs: int
    seconds: dict[str, list[float]] = field(default_factory=dict)
    peak_mib: dict[str, list[float]] = field(default_factory=dict)  # peak RSS past the RSS before the read
    shadows: dict[str, int] = field(default_factory=dict)


def build_log(root: Path, traces: int, *, seed: int = 7) -> None:
    """A store of ``traces`` judged traces of the support task in the shares above, 50,000 to a file."""
    from gil_core.telemetry import TelemetryStore
    from gil_core.telemetry._rows import trace_row
    from gil_core.telemetry.records import TraceRecord

    store, rng = TelemetryStore(root), random.Random(seed)
    path = ({"node": "root", "layer": 1, "chosen": "billing", "p": 0.9, "outcome": "accept", "none_prob": 0.02},)
    template = TraceRecord(
        trace_id="x",
        created_at=datetime.now(UTC),
        task="support",
        state="where is the refund for my order number 123456? it has been two weeks since I sent it back",
        mode="habit/answer",
        path=(*path, {"node": "billing", "layer": 2, "chosen": "refund", "p": 0.8, "outcome": "accept"}),
        output="Refunds reach the original payment method within 5 business days of approval.",
    )
    row = trace_row(template)
    for start in range(0, traces, 50_000):
        rows = []
        for index in range(start, min(traces, start + 50_000)):
            draw = rng.random()
            mode = "fallback" if draw < GENERATED else "memory" if draw < GENERATED + MEMORY else "habit/answer"
            output = f"A generated answer number {index % 300}." if mode == "fallback" else row["output"]
            verdict = "wrong" if rng.random() < WRONG else "correct"
            rows.append(row | {"trace_id": f"t{index}", "mode": mode, "output": output, "feedback_verdict": verdict})
        store.append("traces", rows)


def _read(store_root: Path, arm: str) -> dict[str, Any]:
    """One arm in this process: seconds, peak RSS past the RSS before, shadows found."""
    from gil_core.fallback import TreeAnswerContract
    from gil_core.feedback import Feedback
    from gil_core.habits.costs import EVIDENCE_COLUMNS, evidence_from_row
    from gil_core.habits.shadows import build_shadow_index
    from gil_core.language import ENGLISH
    from gil_core.tasks import TaskDefinition, TaskPolicy
    from gil_core.telemetry import TelemetryStore
    from gil_core.traverse import Thresholds

    tree = support_tree()
    policy = TaskPolicy(thresholds=Thresholds(per_layer=(0.6,), leaf=0.7), memory_threshold=None)
    task = TaskDefinition("support", TreeAnswerContract(tree), tree, policy, ENGLISH)
    store = TelemetryStore(store_root)
    store.scan("traces").head(1).collect()  # Polars' pools and the store's first listing, outside the measure
    before = _rss_mib()
    started = time.perf_counter()
    if arm == "shadows":
        index = Feedback(store, memory=None, learner=None).shadows(task)
    else:
        judged = (
            store.scan("traces")
            .filter((pl.col("task") == task.name) & pl.col("feedback_verdict").is_not_null())
            .select(EVIDENCE_COLUMNS)
            .collect()
        )
        evidence = [item for item in map(evidence_from_row, judged.iter_rows(named=True)) if item is not None]
        index = build_shadow_index(task.tree, evidence, exclude=(task.language.none_of_these,))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    found = sorted((node, shadow.answer) for node, shadows in index.items() for shadow in shadows)
    return {"seconds": seconds, "peak_mib": peak - before, "shadows": found}


def _rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def measure_shadow_read(traces: int, runs: int, root: Path) -> ShadowFigures:
    build_log(root / "store", traces)
    figures = ShadowFigures(traces, runs)
    found: dict[str, list[Any]] = {}
    for _ in range(runs):
        for name, arm in ARMS.items():
            child = subprocess.run(
                [sys.executable, "-m", "benchmarks._shadow_read", "--arm", arm, str(root / "store")],
                check=True,
                capture_output=True,
                text=True,
            )
            measured = json.loads(child.stdout.splitlines()[-1])
            figures.seconds.setdefault(name, []).append(measured["seconds"])
            figures.peak_mib.setdefault(name, []).append(measured["peak_mib"])
            found[name] = measured["shadows"]
            figures.shadows[name] = len(measured["shadows"])
    every, shadows = (found[name] for name in ARMS)
    assert every == shadows, "the two reads give different shadow indexes"
    return figures


def shadow_section(figures: ShadowFigures, command: str) -> Section:
    (before, now) = ARMS
    medians = {name: statistics.median(seconds) for name, seconds in figures.seconds.items()}
    peaks = {name: statistics.median(peaks) for name, peaks in figures.peak_mib.items()}

    def measured(name: str) -> str:
        runs = ", ".join(f"{seconds:.2f}" for seconds in figures.seconds[name])
        return (
            f"{medians[name]:.2f} s (median of {figures.runs} runs: {runs} s); peak RSS past the RSS before the read "
            f"{peaks[name]:.0f} MiB (median); {figures.shadows[name]} shadows"
        )

    rows = [Row(f"{figures.traces:,} judged traces, {before}", "—", measured(before))]
    rows.append(Row(f"{figures.traces:,} judged traces, {now}", "(reported)", measured(now)))
    rows.append(
        Row(
            "only the traces that can make a shadow against every judged trace",
            "(reported)",
            f"{medians[before] / medians[now]:.1f}× as fast, {peaks[now]:.0f} against {peaks[before]:.0f} MiB peak",
        )
    )
    lead = (
        f"A log of {figures.traces:,} traces of the support task, every one judged, in the soak's shares "
        f"({GENERATED:.1%} generated answers, {MEMORY:.0%} memory hits, the rest habit answers; {WRONG:.0%} of the "
        "verdicts wrong), then the shadow index read off it, as a resolver does before its first request with "
        "`show_shadows` on (the default) and again after each chunk of verdicts it gives. Each arm runs in a "
        "fresh process of its own, the arms alternated; both gave the same index."
    )
    return Section(SECTION, command, lead, rows)


if __name__ == "__main__":  # one arm, in a process of its own: python -m benchmarks._shadow_read --arm A STORE
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--arm", choices=sorted(ARMS.values()), required=True)
    parser.add_argument("store", type=Path)
    options = parser.parse_args()
    print(json.dumps(_read(options.store, options.arm)))
