"""Every benchmark of issue #7 in one command: quality and cost (A), speed (B, with the stats benchmark) and
memory false hits (C).

    uv run --extra local python -m benchmarks            # full size (under 30 min here); rewrites BENCHMARKS.md
    uv run --extra local python -m benchmarks --quick    # small sizes (under 3 min, CI); prints only
    uv run --extra local python -m benchmarks --quick --output /tmp/BENCHMARKS.md   # quick, into another file

Each part writes only its own ``##`` sections. A part that fails is reported and the others still run; the
command then exits with status 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from benchmarks import memory_pairs, speed
from benchmarks._report import (
    BENCHMARKS_FILE,
    RUNNER_COMMAND,
    add_output_options,
    destination,
    publish,
    replace_section,
)

PARTS = ("speed", "stats", "pairs", "quality")
STATS_QUICK = ["--traces", "20000", "--runs", "2"]
STATS_FULL = ["--traces", "1000000", "--runs", "3"]


def _quality() -> ModuleType | None:
    """Part A's module, written separately; None while it does not exist yet."""
    try:
        return importlib.import_module("benchmarks.quality")
    except ModuleNotFoundError as exc:
        if exc.name != "benchmarks.quality":
            raise
        return None


def expected_sections(parts: tuple[str, ...] = PARTS, *, local_model: bool = True) -> list[str]:
    """The titles of the sections a run of ``parts`` writes (what the quick test checks for)."""
    titles = []
    if "speed" in parts:
        titles += [
            "Speed: resolver overhead (part B)",
            "Speed: memory lookup (part B)",
            "Speed: telemetry (part B)",
            "Speed: commands in a fresh process",
            "Speed: applying verdicts (part B)",
            "Speed: the shadow index off a large log (part B)",
        ]
        if local_model:
            titles.append("Speed: prompt prefix reuse (part B)")
    if "stats" in parts:
        from benchmarks import stats_speed

        titles.append(stats_speed.SECTION)
    if "pairs" in parts and local_model and memory_pairs.PAIRS_FILE.is_file():
        titles.append(memory_pairs.SECTION)
    quality = _quality()
    if "quality" in parts and local_model and quality is not None:
        titles.append(quality.SECTION)
    return titles


def run_speed(quick: bool, command: str, target: Path | None) -> None:
    publish(speed.run(speed.PARTS, quick=quick, command=command), target)


def run_stats(quick: bool, command: str, target: Path | None) -> None:
    """``benchmarks/stats_speed.py`` (owned by its own author): it writes its section into its module's
    ``BENCHMARKS_FILE``, pointed at ``target`` for the run."""
    from benchmarks import stats_speed

    arguments = STATS_QUICK if quick else STATS_FULL
    if target is None:
        stats_speed.main([*arguments, "--no-write"])
        return
    original = stats_speed.BENCHMARKS_FILE
    stats_speed.BENCHMARKS_FILE = target
    try:
        stats_speed.main(arguments)
    finally:
        stats_speed.BENCHMARKS_FILE = original


def run_pairs(quick: bool, command: str, target: Path | None) -> None:
    arguments = ["--command", command] + (["--quick"] if quick else [])
    memory_pairs.main([*arguments, *(["--output", str(target)] if target else ["--no-write"])])


def run_quality(quick: bool, command: str, target: Path | None) -> None:
    """Part A: its own ``main`` on a full run into BENCHMARKS.md (it copies its plots beside it); otherwise its
    ``run`` into a temporary folder, and its section into ``target`` when there is one."""
    quality = _quality()
    if quality is None:
        _log("quality (part A): benchmarks/quality.py does not exist yet; skipped")
        return
    if not quick and target == BENCHMARKS_FILE:
        quality.main([])
        return
    with tempfile.TemporaryDirectory(prefix="gil-bench-quality-") as out:
        results = quality.run(quick, Path(out))
        print(results.markdown, flush=True)
        if target is not None:
            text = target.read_text(encoding="utf-8") if target.exists() else "# Benchmarks\n"
            target.write_text(replace_section(text, quality.SECTION, results.markdown), encoding="utf-8")


RUNNERS: dict[str, Callable[[bool, str, Path | None], None]] = {
    "speed": run_speed,
    "stats": run_stats,
    "pairs": run_pairs,
    "quality": run_quality,
}
LOCAL_MODEL_PARTS = ("pairs", "quality")


def _log(message: str) -> None:
    print(f"[benchmarks] {message}", file=sys.stderr, flush=True)


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_output_options(parser)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    options = parser.parse_args(arguments)
    parts = [part.strip() for part in options.parts.split(",") if part.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    target = destination(options)
    command = RUNNER_COMMAND + (" --quick" if options.quick else "")
    if parts != list(PARTS):
        command += f" --parts {','.join(parts)}"
    skip_local = os.environ.get("GIL_SKIP_LOCAL_MODEL") == "1"
    seconds: dict[str, float] = {}
    failed: list[str] = []
    for part in parts:
        if skip_local and part in LOCAL_MODEL_PARTS:
            _log(f"{part}: skipped (GIL_SKIP_LOCAL_MODEL=1)")
            continue
        _log(f"{part}: running ({'quick' if options.quick else 'full'} size)")
        started = time.perf_counter()
        try:
            RUNNERS[part](options.quick, command, target)
        except Exception:  # one broken part must not hide the others' figures
            traceback.print_exc()
            failed.append(part)
        seconds[part] = time.perf_counter() - started
        _log(f"{part}: {'FAILED' if part in failed else 'done'} in {seconds[part]:.0f} s")
    total = sum(seconds.values())
    _log("time per part: " + ", ".join(f"{part} {value:.0f} s" for part, value in seconds.items()) + f"; {total:.0f} s")
    if target is not None:
        _log(f"sections written into {target}")
    if failed:
        _log(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
