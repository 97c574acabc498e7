"""Memory false hits on Quora question pairs (issue #7, part C): remember ``a``, look up ``b``.

Each half of ``../shared/data/qqp_pairs.jsonl`` (split at random, duplicates and non-duplicates alike) is one task
in a real ``LanceDBMemory`` holding that half's ``a`` questions, embedded by the real MiniLM model; every ``b`` is
looked up among them. A served hit is right when ``b`` is a duplicate of its own pair's ``a`` and the nearest entry
is that question. Arms decide which lookups are served:

- a static cosine threshold of 0.8 (what GPTCache and LiteLLM ship);
- the threshold chosen by ``gil_core.habits.thresholds.choose_threshold`` for 99% precision on the calibration
  half, evaluated on the other half;
- each of those with and without the negation/number guard (``gil_core.memory.guard.HitGuard``).

An arm is any object with a ``name`` and an async ``decide(calibration, evaluation)``: verification arms (issue
#10) are added to ``arms()`` without touching the rest. Lookups are made once and shared by every arm; each text is
embedded once per run (in memory, never on disk).

    uv run --extra local python -m benchmarks.memory_pairs [--quick] [--output FILE | --no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from benchmarks._pair_lookups import Decision, Lookup, Pair
from benchmarks._report import (
    Row,
    Section,
    add_output_options,
    destination,
    markdown_table,
    publish,
)
from benchmarks._verified_arms import subset, verification_arms
from gil_core.habits.thresholds import choose_threshold
from gil_core.llm.ports import EmbeddingModel
from gil_core.memory import CallableEmbeddingModel, HitGuard, LanceDBMemory, MemoryEntry

ROOT = Path(__file__).resolve().parents[1]
PAIRS_FILE = ROOT.parent / "shared" / "data" / "qqp_pairs.jsonl"
SECTION = "Memory false hits on question pairs (part C)"
COMMAND = "uv run --extra local python -m benchmarks.memory_pairs"
STATIC_THRESHOLD = 0.8
TARGET_PRECISION = 0.99
TARGET_FALSE_HITS = 0.01
MINIMUM_ANSWERED = 20  # hits a selected threshold must keep on the calibration half
SWEEP_TARGETS = (0.9, 0.95, 0.98)
QUICK_PAIRS = 300
SEED = 7
_EMBED_BATCH = 256


class PairsMissingError(FileNotFoundError):
    """The question pairs file is not where the benchmark reads it."""


class Arm(Protocol):
    """A way to decide which lookups memory serves."""

    @property
    def name(self) -> str: ...

    async def decide(self, calibration: Sequence[Lookup], evaluation: Sequence[Lookup]) -> Decision: ...


_GUARD = HitGuard()


def guard_allows(lookup: Lookup) -> bool:
    """Whether the negation/number guard lets ``lookup``'s nearest entry be served for its request."""
    return _GUARD.check(lookup.pair.b, lookup.nearest).allowed


def served_at(threshold: float, lookups: Sequence[Lookup], *, guard: bool) -> list[bool]:
    """Which lookups a memory serves at ``threshold`` (and, with ``guard``, only those the guard allows)."""
    return [item.similarity >= threshold and (not guard or guard_allows(item)) for item in lookups]


@dataclass(frozen=True)
class StaticThreshold:
    """A fixed cosine threshold, as semantic caches ship it."""

    threshold: float
    guard: bool = False

    @property
    def name(self) -> str:
        return f"static cosine {self.threshold:g}" + (" + guard" if self.guard else "")

    async def decide(self, calibration: Sequence[Lookup], evaluation: Sequence[Lookup]) -> Decision:
        return Decision(served_at(self.threshold, evaluation, guard=self.guard), self.threshold)


@dataclass(frozen=True)
class SelectedThreshold:
    """The lowest threshold whose isotonic precision on the calibration half meets ``target_precision``
    (``choose_threshold``, as threshold selection does it for memory). With the guard, lookups the guard refuses
    are never served, so they are no answers at any threshold and stay out of the calibration."""

    target_precision: float
    guard: bool = False

    @property
    def name(self) -> str:
        return f"selected for {self.target_precision:.0%} precision" + (" + guard" if self.guard else "")

    async def decide(self, calibration: Sequence[Lookup], evaluation: Sequence[Lookup]) -> Decision:
        answers = [item for item in calibration if not self.guard or guard_allows(item)]
        choice = choose_threshold(
            [item.similarity for item in answers],
            [item.right for item in answers],
            target_precision=self.target_precision,
            minimum_answered=MINIMUM_ANSWERED,
        )
        if choice.threshold is None:
            note = (
                f"no threshold reaches {self.target_precision:.0%} on the calibration half (best: "
                f"{choice.precision or 0:.1%} precision over {choice.answered} hits): serves nothing"
            )
            return Decision([False] * len(evaluation), None, note)
        note = f"calibration: {choice.answered} hits at {choice.precision:.1%} precision"
        return Decision(served_at(choice.threshold, evaluation, guard=self.guard), choice.threshold, note)


@dataclass(frozen=True)
class FalseHitBudget:
    """Not threshold selection: the lowest threshold that keeps the calibration half's false-hit rate within
    ``budget`` (a quantile of the non-duplicates' similarities). It shows what a 1% false-hit budget leaves of
    the duplicates when precision cannot be reached."""

    budget: float
    guard: bool = False

    @property
    def name(self) -> str:
        return f"lowest threshold with ≤ {self.budget:.0%} false hits on calibration" + (
            " + guard" if self.guard else ""
        )

    async def decide(self, calibration: Sequence[Lookup], evaluation: Sequence[Lookup]) -> Decision:
        others = [item for item in calibration if not item.pair.duplicate]
        served = served_at(-1.0, others, guard=self.guard)  # what the guard lets through at any threshold
        similarities = sorted((item.similarity for item, hit in zip(others, served, strict=True) if hit), reverse=True)
        allowed = int(self.budget * len(others))
        threshold = -1.0 if allowed >= len(similarities) else float(np.nextafter(similarities[allowed], 2.0))
        return Decision(served_at(threshold, evaluation, guard=self.guard), threshold)


def arms() -> list[Arm]:
    """The arms part C compares, in the order of the table."""
    return [
        StaticThreshold(STATIC_THRESHOLD),
        StaticThreshold(STATIC_THRESHOLD, guard=True),
        SelectedThreshold(TARGET_PRECISION),
        SelectedThreshold(TARGET_PRECISION, guard=True),
    ]


def sweep_arms() -> list[Arm]:
    """The arms of part C's sweep: the selected threshold at each target, then the false-hit budget."""
    return [
        *(SelectedThreshold(target, guard) for target in SWEEP_TARGETS for guard in (False, True)),
        FalseHitBudget(TARGET_FALSE_HITS),
        FalseHitBudget(TARGET_FALSE_HITS, guard=True),
    ]


@dataclass(frozen=True)
class Outcome:
    """An arm's figures on the evaluation half."""

    arm: str
    decision: Decision
    duplicates: int
    others: int
    right_hits: int
    wrong_entry_hits: int
    false_hits: int

    @property
    def hit_rate(self) -> float:
        """Duplicates answered with their own question's answer."""
        return self.right_hits / self.duplicates if self.duplicates else 0.0

    @property
    def false_hit_rate(self) -> float:
        """Non-duplicates answered from memory at all."""
        return self.false_hits / self.others if self.others else 0.0

    @property
    def precision(self) -> float | None:
        served = self.right_hits + self.wrong_entry_hits + self.false_hits
        return self.right_hits / served if served else None


def score(arm: str, decision: Decision, evaluation: Sequence[Lookup]) -> Outcome:
    served = [item for item, hit in zip(evaluation, decision.served, strict=True) if hit]
    return Outcome(
        arm=arm,
        decision=decision,
        duplicates=sum(item.pair.duplicate for item in evaluation),
        others=sum(not item.pair.duplicate for item in evaluation),
        right_hits=sum(item.right for item in served),
        wrong_entry_hits=sum(item.pair.duplicate and not item.right for item in served),
        false_hits=sum(not item.pair.duplicate for item in served),
    )


# -- data, embeddings, lookups --------------------------------------------------------------------------------


def read_pairs(path: Path) -> list[Pair]:
    """Every pair of the JSONL file; a bad line raises ``ValueError`` naming ``file:line``."""
    if not path.is_file():
        raise PairsMissingError(f"no question pairs at {path} (expected ../shared/data/qqp_pairs.jsonl)")
    pairs = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                pairs.append(Pair(number, str(row["a"]), str(row["b"]), bool(row["duplicate"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a pair {{a, b, duplicate}} ({exc})") from exc
    return pairs


def split_halves(pairs: Sequence[Pair], *, limit: int | None, seed: int = SEED) -> tuple[list[Pair], list[Pair]]:
    """A calibration and an evaluation half, each with half of the duplicates and half of the others (at most
    ``limit`` pairs in all), shuffled with ``seed``."""
    rng = random.Random(seed)
    halves: tuple[list[Pair], list[Pair]] = ([], [])
    for duplicate in (True, False):
        group = [pair for pair in pairs if pair.duplicate is duplicate]
        rng.shuffle(group)
        if limit is not None:
            group = group[: limit // 2]
        middle = len(group) // 2
        halves[0].extend(group[:middle])
        halves[1].extend(group[middle:])
    for half in halves:
        half.sort(key=lambda pair: pair.line)
    return halves


async def embed_once(model: EmbeddingModel, texts: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """Each distinct text of ``texts`` embedded once by ``model``, in batches."""
    distinct = list(dict.fromkeys(texts))
    vectors: dict[str, tuple[float, ...]] = {}
    for start in range(0, len(distinct), _EMBED_BATCH):
        batch = distinct[start : start + _EMBED_BATCH]
        vectors.update(zip(batch, (await model.embed(batch)).vectors, strict=True))
    return vectors


def cached_embedder(vectors: Mapping[str, tuple[float, ...]], name: str) -> CallableEmbeddingModel:
    """An embedding model answering from ``vectors`` (every text the run embeds, computed once)."""
    return CallableEmbeddingModel(lambda texts: np.asarray([vectors[text] for text in texts]), name=name)


async def look_up(memory: LanceDBMemory, task: str, pairs: Sequence[Pair]) -> list[Lookup]:
    """Remember every ``a`` of ``pairs`` as ``task``'s memory, then look up every ``b``."""
    await memory.rebuild(task, [MemoryEntry(key=p.key, text=p.a, answer=f"answer to {p.key}") for p in pairs])
    lookups = []
    for pair in pairs:
        nearest = await memory.nearest(task, pair.b, 1)
        lookups.append(Lookup(pair, nearest[0].text, float(nearest[0].similarity or 0.0)))
    return lookups


# -- the run ----------------------------------------------------------------------------------------------------


@dataclass
class Results:
    pairs: int
    calibration: int
    evaluation: int
    texts: int
    embed_seconds: float
    lookup_seconds: float
    model: str
    outcomes: list[Outcome]
    sweep: list[Outcome]
    static_calibration: Outcome | None = None
    verified: list[Outcome] = field(default_factory=list)


async def measure(path: Path, *, quick: bool, workdir: Path) -> Results:
    from gil_core.local import MiniLMEmbeddingModel  # the `local` extra

    pairs = read_pairs(path)
    calibration, evaluation = split_halves(pairs, limit=QUICK_PAIRS if quick else None)
    minilm = MiniLMEmbeddingModel()
    texts = [text for pair in calibration + evaluation for text in (pair.a, pair.b)]
    started = time.perf_counter()
    vectors = await embed_once(minilm, texts)
    embedded = time.perf_counter() - started
    memory = LanceDBMemory(workdir / "memory", cached_embedder(vectors, minilm.name))
    started = time.perf_counter()
    calibration_lookups = await look_up(memory, "qqp-calibration", calibration)
    evaluation_lookups = await look_up(memory, "qqp-evaluation", evaluation)
    looked_up = time.perf_counter() - started
    outcomes = [
        score(arm.name, await arm.decide(calibration_lookups, evaluation_lookups), evaluation_lookups) for arm in arms()
    ]
    sweep = [
        score(arm.name, await arm.decide(calibration_lookups, evaluation_lookups), evaluation_lookups)
        for arm in sweep_arms()
    ]
    verified = []
    for verified_arm in verification_arms(quick):
        decision = await verified_arm.decide(calibration_lookups, evaluation_lookups)
        verified.append(score(verified_arm.name, decision, subset(evaluation_lookups, decision, verified_arm)))
    static = StaticThreshold(STATIC_THRESHOLD)
    static_calibration = score(static.name, await static.decide((), calibration_lookups), calibration_lookups)
    return Results(
        pairs=len(calibration) + len(evaluation),
        calibration=len(calibration),
        evaluation=len(evaluation),
        texts=len(vectors),
        embed_seconds=embedded,
        lookup_seconds=looked_up,
        model=minilm.name,
        outcomes=outcomes,
        sweep=sweep,
        static_calibration=static_calibration,
        verified=verified,
    )


def section(results: Results, command: str) -> Section:
    rows = []
    for outcome in results.outcomes:
        if not outcome.arm.startswith("selected"):
            continue
        threshold = outcome.decision.threshold
        if threshold is None:
            measured = f"no threshold selected: {outcome.decision.note}"
        else:
            measured = f"{outcome.false_hit_rate:.2%} ({outcome.false_hits}/{outcome.others}) at {threshold:.4f}"
        rows.append(
            Row(
                f"false-hit rate at the selected threshold, {outcome.arm}",
                f"≤ {TARGET_FALSE_HITS:.0%}",
                measured,
                threshold is not None and outcome.false_hit_rate <= TARGET_FALSE_HITS,
            )
        )
        rows.append(
            Row(
                f"duplicates that still hit, {outcome.arm}",
                "report",
                f"{outcome.hit_rate:.1%} ({outcome.right_hits}/{outcome.duplicates})",
            )
        )
    for outcome in results.outcomes:
        if outcome.arm.startswith("static"):
            rows.append(
                Row(
                    f"false-hit rate, {outcome.arm} (baseline)",
                    "—",
                    f"{outcome.false_hit_rate:.2%} ({outcome.false_hits}/{outcome.others}); "
                    f"duplicates hit {outcome.hit_rate:.1%}",
                )
            )
    lead = (
        f"{results.pairs:,} Quora question pairs (`../shared/data/qqp_pairs.jsonl`, half duplicates), split at "
        f"random into a calibration half ({results.calibration:,}) and an evaluation half ({results.evaluation:,}), "
        f"each a task of its own in one `LanceDBMemory`. Every `a` is remembered, every `b` looked up (nearest "
        f"by exact cosine); a hit is right only when the pair is a duplicate and the nearest entry is its own `a`. "
        f"Embedder: {results.model} (MiniLM, int8 ONNX), {results.texts:,} distinct texts embedded once in "
        f"{results.embed_seconds:.0f} s; {results.calibration + results.evaluation:,} lookups in "
        f"{results.lookup_seconds:.1f} s. Figures are on the evaluation half."
    )
    notes = []
    if results.static_calibration is not None:
        calibration = results.static_calibration
        notes.append(
            f"The static 0.8 threshold on the calibration half: {calibration.hit_rate:.1%} of duplicates hit, "
            f"{calibration.false_hit_rate:.1%} of non-duplicates hit (NOTES: 77% / 21% over all 4,000 pairs)."
        )
    notes.append(_finding(results))
    rows += _verified_rows(results)
    tables = [
        _arms_table(results.outcomes),
        "What other precision targets buy (same selection, same halves), and what a plain 1% false-hit budget "
        "on the calibration half leaves:",
        _arms_table(results.sweep),
    ]
    if results.verified:
        tables += [
            "Verified hits (issue #10): bands chosen on the calibration half (accept for 99% precision, verify for "
            "50%), a one-token same-request judgment in between; the oracle verifier is always right, the local "
            "model is SmolLM2-135M through the product's own `SameRequestVerifier`:",
            _arms_table(results.verified),
            "\n".join(f"- {outcome.arm}: {outcome.decision.note}" for outcome in results.verified),
        ]
    return Section(SECTION, command, lead, rows, notes, extra_tables=tables)


def _verified_rows(results: Results) -> list[Row]:
    rows = []
    for outcome in results.verified:
        share = outcome.decision.extra.get("verified share", "?")
        if "(oracle)" in outcome.arm:
            met = outcome.false_hit_rate <= TARGET_FALSE_HITS and outcome.hit_rate >= 0.40
            rows.append(
                Row(
                    f"false hits / duplicates hit, {outcome.arm}",
                    "≤ 1% / ≥ 40%",
                    f"{outcome.false_hit_rate:.2%} / {outcome.hit_rate:.1%}; {share} of lookups verified",
                    met,
                )
            )
        else:
            rows.append(
                Row(
                    f"false hits / duplicates hit, {outcome.arm}",
                    "report",
                    f"{outcome.false_hit_rate:.2%} / {outcome.hit_rate:.1%}; {share} of lookups verified",
                )
            )
    return rows


def _arms_table(outcomes: Sequence[Outcome]) -> str:
    """One row per arm; an arm's own figures (``Decision.extra``, e.g. the share that paid for a verification)
    go in a last column when any arm has some."""
    extra = any(outcome.decision.extra for outcome in outcomes)
    header = ["arm", "threshold", "duplicates hit", "wrong entry served", "false hits (non-duplicates)", "precision"]
    rows = [
        [
            outcome.arm,
            f"{outcome.decision.threshold:.4f}" if outcome.decision.threshold is not None else "none",
            f"{outcome.hit_rate:.1%}",
            f"{outcome.wrong_entry_hits}",
            f"{outcome.false_hit_rate:.2%}",
            f"{outcome.precision:.1%}" if outcome.precision is not None else "—",
            *(["; ".join(f"{name}: {value}" for name, value in outcome.decision.extra.items())] if extra else []),
        ]
        for outcome in outcomes
    ]
    return markdown_table([*header, *(["also"] if extra else [])], rows, align="lrrrrr" + ("l" if extra else ""))


def _finding(results: Results) -> str:
    plain = next(o for o in results.outcomes if o.arm == SelectedThreshold(TARGET_PRECISION).name)
    guarded = next(o for o in results.outcomes if o.arm == SelectedThreshold(TARGET_PRECISION, guard=True).name)
    static = results.outcomes[0]
    selected = [o for o in (plain, guarded) if o.decision.threshold is not None]
    if not selected:
        return (
            f"**Miss**: threshold selection finds no similarity threshold with {TARGET_PRECISION:.0%} precision on "
            "the calibration half, with or without the guard, so memory would serve nothing (0% false hits, but "
            f"0% of duplicates hit; static 0.8 serves {static.false_hit_rate:.1%} false hits). Cause: the data — on "
            "these adversarial pairs similarity alone cannot reach 99% precision (the precision of the top "
            "similarity band stays below it); a check in the uncertain band (issue #10) is what can."
        )
    met = [o for o in selected if o.false_hit_rate <= TARGET_FALSE_HITS]
    if not met:
        worst = max(selected, key=lambda o: o.false_hit_rate)
        return (
            f"**Miss**: at the selected threshold false hits stay above 1% on the evaluation half "
            f"({worst.arm}: {worst.false_hit_rate:.1%}). Cause: the data — the threshold chosen on one half does "
            "not hold its precision on the other."
        )
    best = max(met, key=lambda o: o.hit_rate)
    return (
        f"Finding: the threshold selected for {TARGET_PRECISION:.0%} precision keeps false hits at "
        f"{best.false_hit_rate:.1%} ({best.arm}), against {static.false_hit_rate:.1%} at the static 0.8 "
        f"threshold, while {best.hit_rate:.1%} of duplicates still hit (static 0.8: {static.hit_rate:.1%}). Safety "
        "costs recall on such pairs; verification in the uncertain band (issue #10) is what can recover it."
    )


def main(arguments: list[str] | None = None) -> list[Section]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_output_options(parser)
    parser.add_argument("--pairs", type=Path, default=PAIRS_FILE, help="the question pairs (JSONL: a, b, duplicate)")
    parser.add_argument("--command", default=None, help=argparse.SUPPRESS)  # the runner names itself
    options = parser.parse_args(arguments)
    command = options.command or (COMMAND + (" --quick" if options.quick else ""))
    if not options.pairs.is_file():
        print(f"[memory_pairs] skipped: no question pairs at {options.pairs}", file=sys.stderr, flush=True)
        return []
    with tempfile.TemporaryDirectory(prefix="gil-bench-pairs-") as workdir:
        results = asyncio.run(measure(options.pairs, quick=options.quick, workdir=Path(workdir)))
    sections = [section(results, command)]
    publish(sections, destination(options))
    return sections


if __name__ == "__main__":
    main(sys.argv[1:])
