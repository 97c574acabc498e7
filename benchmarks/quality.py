"""Quality and cost on real data with the real local models (issue #7, part A).

Three streams (the bundled support tickets, a smart-home stream from Home Assistant's intents, FrugalGPT's gold
headlines) each run four arms on the same seeded requests: (1) full generation, (2) the tree with narrowed
fallback, (3) = (2) with the reflex judge, (4) = (2) with memory, on a repeating version of the stream (Zipf
repeats and paraphrases) with feedback from the answer key as it goes. Energy is priced by coefficients fitted to
the run's own calls. Figures are ratios between arms measured in the same run.

    uv run --extra local python -m benchmarks.quality            # full size; rewrites its BENCHMARKS.md section
    uv run --extra local python -m benchmarks.quality --quick    # tiny subsets (CI); prints, writes nothing shared

``run(quick, out_dir)`` is the entry point for other code: it writes the store, memory, plots, ``quality.json``
and ``quality.md`` under ``out_dir`` and returns the results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import time
import warnings
from datetime import date
from pathlib import Path

from benchmarks._quality_arms import ArmRun, run_arms, runs_from_json, runs_to_json
from benchmarks._quality_markdown import SECTION, render_section, replace_section
from benchmarks._quality_plots import plot_stream
from benchmarks._quality_report import arm_figures, fit_prices, generated_texts, priced_calls
from benchmarks._quality_results import QualityResults, Sizes, StreamResult
from benchmarks._quality_streams import STREAMS, Stream, StreamMissingError, repeating_stream
from gil_core.ontology import Tree, TreeLintWarning
from gil_core.telemetry import TelemetryStore

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_FILE = ROOT / "BENCHMARKS.md"
PLOTS_DIR = ROOT / "docs" / "bench"
COMMAND = "uv run --extra local python -m benchmarks.quality"
# Generous: on a 2-core machine shared with other work, one call has taken over two minutes and the server's
# start-up over one (measured here); a timeout would turn a slow answer into a wrong one.
CALL_TIMEOUT_SECONDS = 600.0
STARTUP_TIMEOUT_SECONDS = 300.0
RUNS_FILE = "runs.json"  # every outcome of the run, for ``report`` (and ``--report-only``)


# Full size: about 3 x 30 + ~35 cold requests per stream at ~1-2 s each on 2 idle cores (~12 min in all).
FULL = Sizes(("support", "home", "headlines"), requests=30, events=90, window=6)
QUICK = Sizes(("support", "home"), requests=3, events=6, window=2)


def section(results: QualityResults, plot_base: str) -> str:
    """The BENCHMARKS.md section of ``results``, linking the plots as ``plot_base/<file name>``."""
    return render_section(results, plot_base=plot_base, command=COMMAND + (" --quick" if results.quick else ""))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(quick: bool, out_dir: Path) -> QualityResults:
    """Run every stream's arms at the quick or full size into ``out_dir`` (emptied first) and report."""
    sizes = QUICK if quick else FULL
    out_dir = Path(out_dir)
    for part in ("store", "memory", "plots", "server"):
        shutil.rmtree(out_dir / part, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    streams, loaded = _load_streams(sizes)
    runs = asyncio.run(_run_streams(loaded, sizes, out_dir, {s.name: s for s in streams}))
    record = {
        "quick": quick,
        "seconds": time.perf_counter() - started,
        "machine": _machine(),
        "date": date.today().isoformat(),
        "streams": [{"name": s.name, "seconds": s.seconds, "skipped": s.skipped} for s in streams],
        "runs": runs_to_json([arm_run for stream_runs in runs.values() for arm_run in stream_runs]),
    }
    (out_dir / RUNS_FILE).write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return report(out_dir)


def report(out_dir: Path) -> QualityResults:
    """The results of the run recorded in ``out_dir``: energy fitted from its store's calls (``fit-energy``),
    figures, plots, ``quality.md`` and ``quality.json``. Needs no model: a report can be redone."""
    out_dir = Path(out_dir)
    record = json.loads((out_dir / RUNS_FILE).read_text(encoding="utf-8"))
    sizes = QUICK if record["quick"] else FULL
    streams, loaded = _load_streams(sizes)
    runs = runs_from_json(record["runs"])
    for result, saved in zip(streams, record["streams"], strict=True):
        result.seconds = saved["seconds"]
    store = TelemetryStore(out_dir / "store")
    prices = fit_prices(store)  # gil fit-energy over this run's calls, before anything is priced
    costs = priced_calls(store, prices)
    texts = generated_texts(store)
    for result in streams:
        if result.skipped is not None:
            continue
        tree = _tree(loaded[result.name])
        stream_runs = [arm_run for arm_run in runs if arm_run.stream == result.name]
        result.arms = [arm_figures(arm_run, costs, tree, window=sizes.window, texts=texts) for arm_run in stream_runs]
        result.plot = plot_stream(
            result.title, result.arms, sizes.window, out_dir / "plots" / f"quality-{result.name}.png", unit="ms"
        )
    results = QualityResults(
        record["quick"], sizes, out_dir, record["date"], record["seconds"], prices, streams, record["machine"]
    )
    results.markdown = section(results, "plots")
    (out_dir / "quality.md").write_text(results.markdown, encoding="utf-8")
    (out_dir / "quality.json").write_text(json.dumps(results.to_json(), indent=2, default=str), encoding="utf-8")
    return results


def _load_streams(sizes: Sizes) -> tuple[list[StreamResult], dict[str, Stream]]:
    """The streams of ``sizes``; one whose input is missing is skipped with the reason."""
    results, loaded = [], {}
    for name in sizes.streams:
        try:
            stream = STREAMS[name]()
        except StreamMissingError as exc:
            _log(f"[quality] skipping the {name} stream: {exc}")
            results.append(StreamResult(name, name, skipped=str(exc)))
            continue
        loaded[name] = stream
        results.append(StreamResult(name, stream.title, stream.source, len(stream.requests)))
    return results, loaded


async def _run_streams(
    streams: dict[str, Stream], sizes: Sizes, out_dir: Path, results: dict[str, StreamResult]
) -> dict[str, list[ArmRun]]:
    """Every stream's arms on one local server of the benchmark's own: no other client's requests queue
    beside ours or evict our prompt prefixes from its cache, and no other process can replace it mid-run."""
    from gil_core.local import LocalLLMServer  # the `local` extra

    runs: dict[str, list[ArmRun]] = {}
    with LocalLLMServer(cache_dir=out_dir / "server", startup_timeout=STARTUP_TIMEOUT_SECONDS) as server:
        async with server.chat_model(timeout=CALL_TIMEOUT_SECONDS) as chat:
            for name, stream in streams.items():
                requests = stream.sample(sizes.requests)
                repeating = repeating_stream(stream, requests, sizes.events)
                _log(f"[quality] {name}: {len(requests)} requests x 3 arms + {len(repeating)} repeating events")
                started = time.perf_counter()
                runs[name] = await run_arms(
                    stream, requests, repeating, store=out_dir / "store", memory=out_dir / "memory", chat=chat
                )
                results[name].seconds = time.perf_counter() - started
                _log(f"[quality] {name}: done in {results[name].seconds:.0f} s")
    return runs


def _tree(stream: Stream) -> Tree:
    from gil_core.taskfile import load_task_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return load_task_file(stream.task_file).task.tree


def _machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs (shared; 1-minute load average {load:.1f} at the end), "
        f"Python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> QualityResults:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny subsets (CI): writes nothing shared")
    parser.add_argument("--out", type=Path, default=None, help="working folder (default: .gil/bench/quality[-quick])")
    parser.add_argument(
        "--report-only", action="store_true", help="redo the report of the run recorded in the working folder"
    )
    args = parser.parse_args(argv)
    out = args.out or ROOT / ".gil" / "bench" / ("quality-quick" if args.quick else "quality")
    results = report(out) if args.report_only else run(args.quick, out)
    if results.quick:
        print(results.markdown)
    else:
        PLOTS_DIR.mkdir(parents=True, exist_ok=True)
        for plot in results.plots():
            shutil.copyfile(plot, PLOTS_DIR / plot.name)
        markdown = section(results, PLOTS_DIR.relative_to(ROOT).as_posix())
        BENCHMARKS_FILE.write_text(
            replace_section(BENCHMARKS_FILE.read_text(encoding="utf-8"), markdown), encoding="utf-8"
        )
        print(markdown)
        _log(f"[quality] wrote the section {SECTION!r} of {BENCHMARKS_FILE} and {len(results.plots())} plots")
    _log(f"[quality] {results.seconds:.0f} s in all; details in {out}")
    return results


if __name__ == "__main__":
    main()
