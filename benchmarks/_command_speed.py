"""Speed of the commands a person types (issue #18, point 4): each in a fresh process, against the bare
interpreter's start measured in the same run.

* ``gil --help`` and ``gil lint-tree`` on the support tree.
* ``gil resolve`` answered from memory on the demo's own task file (``ontologies/support-task.yaml``: the local
  embedder, the local chat model, memory and the learned judge on), its store and memory moved to a temporary
  folder and seeded in this process beforehand: one request resolved with a scripted chat model, then corrected,
  so memory holds it; the timed command resolves the same text. Its breakdown is read from the run: the
  interpreter's start (the baseline), the imports (``-X importtime``, one extra run), the embedding call as the
  trace records it (the embedder's first texts load its model), and the rest (the task file, memory's open and
  lookup, the trace). The command must not start the local model server: the folder where a server records
  itself (``$XDG_CACHE_HOME/gil``, private to the run) is checked to stay empty.

Every command is run once untimed first (warm page cache and Python's bytecode cache, as a person's second
command finds them), then ``runs`` times. The children run with Python's default of caching bytecode: this
machine's environment sets ``PYTHONDONTWRITEBYTECODE=1``, which the benchmark removes for them, caching in a
folder of its own (``PYTHONPYCACHEPREFIX``); ``gil resolve`` is also timed with no bytecode cache at all (an
empty prefix folder that is never written: every module compiled from source on every run), as a row of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks._report import Row, Section
from gil_core.runtime import open_runtime
from gil_core.taskfile import load_task_file
from gil_core.testing import ScriptedChatModel, ScriptedReply

ROOT = Path(__file__).resolve().parents[1]
TITLE = "Speed: commands in a fresh process"
REQUEST = "My parcel never arrived and the tracking page has not changed for a week, where is it?"
ANSWER = "We are sorry your parcel is late. We will trace it with the carrier and reply within 2 days."
RESOLVE_TARGET_S = 3.0
LINT_TARGET_S = 1.0


@dataclass(frozen=True)
class CommandTimes:
    runs: int
    interpreter: list[float]
    help: list[float]
    lint: list[float]
    resolve: list[float]
    resolve_uncompiled: list[float]  # the same with PYTHONDONTWRITEBYTECODE=1
    imports_s: float  # the resolve process's imports, summed from -X importtime (top-level rows)
    heavy_s: dict[str, float]  # the heavy libraries among them (cumulative at their first import)
    embedding_ms: float  # the embedding call the resolve trace records (median over the timed runs)
    mode: str  # how the timed resolve answered (memory expected)
    server_files: int  # files the local server would have left in the private cache (0 expected)


def _gil(*args: str) -> list[str]:
    return [sys.executable, "-c", "from flows.cli import main; main()", *args]


def _timed(command: Sequence[str], env: dict[str, str], runs: int) -> tuple[list[float], str]:
    walls: list[float] = []
    output = ""
    for attempt in range(runs + 1):  # the first run warms the page cache and is not counted
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, env=env, cwd=ROOT)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[3:])} failed ({done.returncode}): {done.stderr[-2000:]}")
        output = done.stdout
        if attempt:
            walls.append(wall)
    return walls, output


def _task_file(root: Path) -> Path:
    """The demo's task file, its store and memory moved under ``root`` (every other key as shipped)."""
    data = yaml.safe_load((ROOT / "ontologies" / "support-task.yaml").read_text(encoding="utf-8"))
    data["tree"] = str(ROOT / "ontologies" / data["tree"])
    data["store"] = str(root / "store")
    data["memory"] = str(root / "memory")
    path = root / "support-task.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


async def _seed(path: Path) -> None:
    """One request resolved (the scripted model answers none of these) and corrected, so memory holds it."""
    task_file = load_task_file(path)
    chat = ScriptedChatModel(responder=lambda messages, **_: ScriptedReply(task_file.task.language.none_of_these))
    async with open_runtime(task_file, chat=chat) as runtime:
        result = await runtime.resolver.resolve(runtime.task, REQUEST)
        if not await runtime.resolver.feedback(runtime.task, result.trace_id, False, ANSWER):
            raise RuntimeError("memory did not learn the seeded correction")


HEAVY = ("lancedb", "polars", "pandera", "pyarrow", "onnxruntime", "tokenizers", "httpx", "faiss", "sklearn", "prefect")


def _import_seconds(command: Sequence[str], env: dict[str, str]) -> tuple[float, dict[str, float]]:
    """The imports of one run of ``command``: summed over the top-level rows of ``-X importtime`` (µs → s), and
    the heavy libraries' own, each the cumulative time at its first import (nested under another or not; one
    imported inside another's first import is counted in both)."""
    done = subprocess.run(
        [command[0], "-X", "importtime", *command[1:]],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
        cwd=ROOT,
    )
    total = 0
    heavy: dict[str, float] = {}
    for line in done.stderr.splitlines():
        found = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if not found:
            continue
        if not found.group(2):  # a module imported at the top level (no indent)
            total += int(found.group(1))
        if found.group(3) in HEAVY:
            heavy.setdefault(found.group(3), int(found.group(1)) / 1e6)
    return total / 1e6, heavy


def _embedding_ms(store: Path) -> list[float]:
    import polars as pl

    from gil_core.telemetry import TelemetryStore

    calls = TelemetryStore(store).scan("calls").filter(pl.col("role") == "embed").collect()
    return [float(value) for value in calls.sort("created_at")["latency_ms"].to_list()]


def measure_commands(runs: int, root: Path) -> CommandTimes:
    root.mkdir(parents=True, exist_ok=True)
    cache = root / "xdg-cache"
    cache.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # Python's default: bytecode cached (the module doc) ...
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")  # ... in a folder of the run's, written by the warm-up
    path = _task_file(root)
    asyncio.run(_seed(path))
    seeded = len(_embedding_ms(root / "store"))
    interpreter, _ = _timed([sys.executable, "-c", "pass"], env, runs)
    help_walls, _ = _timed(_gil("--help"), env, runs)
    lint, _ = _timed(_gil("lint-tree", str(ROOT / "ontologies" / "support.yaml")), env, runs)
    resolve_command = _gil("resolve", "-t", str(path), "--json", REQUEST)
    resolve, output = _timed(resolve_command, env, runs)
    never = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(root / "no-pycache")}  # stays empty
    uncompiled, _ = _timed(resolve_command, {**env, **never}, runs)
    embedding = _embedding_ms(root / "store")[seeded + 1 : seeded + 1 + runs]  # the timed cached runs' (no warm-up)
    imports, heavy = _import_seconds(resolve_command, env)
    server_files = sum(1 for _ in (cache / "gil").rglob("*"))  # where the server records itself
    shutil.rmtree(cache, ignore_errors=True)
    return CommandTimes(
        runs=runs,
        interpreter=interpreter,
        help=help_walls,
        lint=lint,
        resolve=resolve,
        resolve_uncompiled=uncompiled,
        imports_s=imports,
        heavy_s=heavy,
        embedding_ms=statistics.median(embedding) if embedding else float("nan"),
        mode=str(json.loads(output).get("mode")),
        server_files=server_files,
    )


def _walls(values: Sequence[float]) -> str:
    return f"p50 {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f}; {len(values)} runs)"


def commands_section(times: CommandTimes, command: str) -> Section:
    base = statistics.median(times.interpreter)
    resolve = statistics.median(times.resolve)
    lint = statistics.median(times.lint)
    embedding = times.embedding_ms / 1000
    rest = max(0.0, resolve - base - times.imports_s - embedding)
    rows = [
        Row("baseline: the bare interpreter (`python -c pass`)", "—", _walls(times.interpreter)),
        Row("`gil --help`", "—", f"{_walls(times.help)}; {statistics.median(times.help) / base:.1f}× the baseline"),
        Row("`gil lint-tree` on the support tree", f"≤ {LINT_TARGET_S:g} s", f"{_walls(times.lint)}; "
            f"{lint / base:.1f}× the baseline", lint <= LINT_TARGET_S),
        Row("`gil resolve` answered from memory (the demo's task file, local embedder)", f"≤ {RESOLVE_TARGET_S:g} s",
            f"{_walls(times.resolve)}; answered by {times.mode}; local model server started: "
            f"{'no' if times.server_files == 0 else f'yes ({times.server_files} files)'}",
            resolve <= RESOLVE_TARGET_S and times.mode == "memory" and times.server_files == 0),
        Row("`gil resolve` as above with no bytecode cache (`PYTHONDONTWRITEBYTECODE=1`, every module compiled)", "—",
            f"{_walls(times.resolve_uncompiled)}; {statistics.median(times.resolve_uncompiled) / resolve:.1f}× the "
            "cached run"),
        Row("… of which the interpreter's start", "—", f"{base:.2f} s ({base / resolve:.0%})"),
        Row("… of which imports (`-X importtime`, one extra run)", "—",
            f"{times.imports_s:.2f} s ({times.imports_s / resolve:.0%}); heavy libraries, each at its first import "
            f"(one inside another counted in both): "
            + (", ".join(f"{name} {seconds:.2f} s" for name, seconds in
                         sorted(times.heavy_s.items(), key=lambda item: -item[1])) or "none")),
        Row("… of which the embedding call (the embedder's model loaded on its first texts), as recorded", "—",
            f"{embedding:.2f} s ({embedding / resolve:.0%})"),
        Row("… the rest (task file, memory opened and looked up, the trace written)", "—",
            f"{rest:.2f} s ({rest / resolve:.0%})"),
    ]  # fmt: skip
    lead = (
        'Each command in a fresh process (`python -c "from flows.cli import main; main()" …`), run once untimed '
        f"(warm page cache), then {times.runs} times. `gil resolve` uses the demo's own task file "
        "(`ontologies/support-task.yaml`, store and memory moved to a temporary folder), its memory seeded in the "
        "benchmark's process beforehand with one corrected request; the timed command resolves the same text. "
        "The breakdown is read from the run: imports from one extra run under `-X importtime` (top-level modules "
        "summed), the embedding call from the latency the trace records, the rest is what remains of the p50. "
        "Python caches bytecode in the children (its default; this machine's environment turns it off, and the "
        "row with `PYTHONDONTWRITEBYTECODE=1` shows what that costs)."
    )
    return Section(TITLE, command, lead, rows)
