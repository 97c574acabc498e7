"""How close a tree drafted from an export (``gil init --from``, ``gil_core.tree_draft``) comes to the trees written
by hand for the bundled streams, and what the learned judge gets right under each.

    uv run --extra local python -m benchmarks.tree_draft

Each stream's requests with their answer key's answers stand for a help desk's export. Drafts, each measured
against the hand-written tree in the same run:

* **from the whole stream**, with no category column: as if the export held every request the stream will send;
* **from its first 150 requests**, no category column: a short history, the requests after it new (an answer the
  draft lacks cannot be given, and counts wrong);
* **from the whole stream with the key's categories** (``--category-column``).

Figures: the options and templates drafted against the hand tree's options, the categories; how the drafted
categories agree with the hand tree's over the requests both trees can answer (scikit-learn's adjusted Rand index:
1 the same grouping, about 0 no better than chance); and the learned judge's right answers among the never-seen
requests from position 150 on, replayed as ``benchmarks.learned_gating`` replays the design arms (memory at 0.9,
the stand-in LLM always wrong, every answer's verdict after each chunk of 50), its default policy. A request's key
answer is mapped to the drafted option with that text, or to the template its request fills to that text.

**Size.** A last row times ``gil init --from``'s part, ``read_answered`` and ``draft_tree`` with the product's
MiniLM, on an export of ``LARGE_ROWS`` rows made of the support stream's requests reworded (a greeting, a case
change or a typo, as the repeating streams do), their answers the key's, written as a CSV file.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks._learned_setup import top_category
from benchmarks._quality_streams import SEED, paraphrase, support_stream
from benchmarks._report import Row, Section, add_output_options, destination, publish
from benchmarks.feedback_queue import STREAMS, Embedded, embed_priors, embed_stream
from benchmarks.learned_gating import PRECISION, WARMUP, measure
from gil_core.batch import TicketFormat
from gil_core.fallback.slots import filled_without_model
from gil_core.language import NONE_NAMES
from gil_core.llm import EmbeddingModel
from gil_core.ontology import Tree
from gil_core.ontology.model import OptionKind
from gil_core.tasks import LearnedPolicy
from gil_core.tree_draft import AnsweredRequest, DraftedTree, draft_tree, read_answered

TITLE = "Drafting a tree from an export"
LARGE_ROWS = 20_000
COMMAND = "uv run --extra local python -m benchmarks.tree_draft"
MISSING = "<not in the draft>"  # the key's answer for a request whose answer the draft lacks: never given


@dataclass(frozen=True)
class Arm:
    """One tree for a stream: what it holds and what the learned judge got right under it."""

    label: str
    options: int
    templates: int
    categories: int
    answerable: int  # requests whose key answer the tree gives (or none of these)
    requests: int
    agreement: float | None  # adjusted Rand index of its categories against the hand tree's (None: the hand tree)
    right: int
    measured: int
    seconds: float | None = None  # the draft's time (None: the hand tree)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _answered(data: Embedded, count: int, *, categories: bool) -> list[AnsweredRequest]:
    stream = data.spec.load()
    requests = list(stream.requests[: data.spec.size])[:count]
    tree = data.task.tree
    return [
        AnsweredRequest(
            request.text,
            request.expected,
            (top_category(tree, request.option_id) or "none") if categories else None,
        )
        for request in requests
    ]


def _mapped(tree: Tree, data: Embedded) -> list[str | None]:
    """Per request, the drafted option its key answer is (None: none of these; ``MISSING``: not in the draft)."""
    stream = data.spec.load()
    texts = {option.text: option.id for option, _ in tree.options() if option.text is not None}
    templates = [option for option, _ in tree.options() if option.kind is OptionKind.TEMPLATE]
    out: list[str | None] = []
    for request in list(stream.requests[: data.spec.size]):
        answer = request.expected.strip()
        if answer.casefold() in NONE_NAMES:
            out.append(None)
        elif answer in texts:
            out.append(texts[answer])
        else:
            filled = [option.id for option in templates if filled_without_model(request.text, option) == answer]
            out.append(filled[0] if filled else MISSING)
    return out


async def _draft_arm(label: str, data: Embedded, rows: list[AnsweredRequest], embedder: EmbeddingModel) -> Arm:
    from sklearn.metrics import adjusted_rand_score  # type: ignore[import-untyped]

    started = time.perf_counter()
    draft: DraftedTree = await draft_tree(rows, embedder)
    seconds = time.perf_counter() - started
    tree = draft.tree
    options = _mapped(tree, data)
    drafted = replace(
        data,
        task=replace(data.task, tree=tree),
        options=options,
        learnable=[option != MISSING for option in options],
        priors=await embed_priors(tree, embedder),
    )
    outcome = measure(drafted, LearnedPolicy(precision=PRECISION), loco=False)
    both = [
        (top_category(data.task.tree, hand), top_category(tree, mine))
        for hand, mine in zip(data.options, options, strict=True)
        if hand is not None and mine not in (None, MISSING)
    ]
    agreement = float(adjusted_rand_score([a for a, _ in both], [b for _, b in both])) if both else None
    return Arm(label, draft.options, draft.templates, draft.categories,
               sum(1 for option in options if option != MISSING), len(options), agreement, outcome.right,
               outcome.measured, seconds)  # fmt: skip


def _hand_arm(data: Embedded) -> Arm:
    tree = data.task.tree
    outcome = measure(data, LearnedPolicy(precision=PRECISION), loco=False)
    templates = sum(1 for option, _ in tree.options() if option.kind is OptionKind.TEMPLATE)
    return Arm("the tree written by hand", sum(1 for _ in tree.options()), templates, len(tree.root.children),
               sum(data.learnable), len(data.options), None, outcome.right, outcome.measured)  # fmt: skip


def _large_export(folder: Path, rows: int) -> Path:
    """A CSV export of ``rows`` support requests, reworded, with their key's answers."""
    stream = support_stream()
    rng = random.Random(f"{SEED}/tree-draft/large")
    path = folder / "export.csv"
    with path.open("w", encoding="utf-8", newline="") as out:
        sheet = csv.writer(out)
        sheet.writerow(["id", "text", "answer"])
        for n in range(rows):
            request = rng.choice(stream.requests)
            sheet.writerow([f"t{n}", paraphrase(request.text, rng, stream.wrappers), request.expected])
    return path


def _time_large(embedder: EmbeddingModel, rows: int) -> str:
    """The time and peak RSS of reading and drafting an export of ``rows`` rows (module doc)."""
    import resource

    with tempfile.TemporaryDirectory() as folder:
        path = _large_export(Path(folder), rows)
        started = time.perf_counter()
        answered, bad, _ = read_answered(path, TicketFormat())
        read = time.perf_counter() - started
        draft = asyncio.run(draft_tree(answered, embedder))
        took = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (
        f"{len(answered):,} rows ({len(bad)} bad): read in {read:.1f} s, drafted in {took:.1f} s in all "
        f"({draft.options} options, {draft.templates} templates, {draft.categories} categories); the process's "
        f"peak RSS {peak:.0f} MiB"
    )


def _share(k: int, n: int) -> str:
    return f"{100 * k / n:.1f}% ({k}/{n})" if n else "—"


def section(results: dict[str, list[Arm]], command: str, large: str | None = None) -> Section:
    rows = []
    for stream, arms in results.items():
        hand = arms[0]
        for arm in arms:
            delta = (
                "" if arm is hand else f" ({100 * (arm.right / arm.measured - hand.right / hand.measured):+.1f} points)"
            )
            agreement = (
                "" if arm.agreement is None else f"; categories against the hand tree's: ARI {arm.agreement:.2f}"
            )
            took = "" if arm.seconds is None else f"; drafted in {arm.seconds:.1f} s"
            rows.append(
                Row(
                    f"{stream}: {arm.label}",
                    "(reported)",
                    f"{arm.options} options ({arm.templates} templates) in {arm.categories} categories; "
                    f"answers {arm.answerable} of {arm.requests} requests{agreement}; the learned "
                    f"judge right on never-seen requests after {WARMUP}: {_share(arm.right, arm.measured)}{delta}"
                    f"{took}",
                )
            )
    lead = (
        "Each stream's requests with their key's answers stand for an export (the module doc of "
        "`benchmarks/tree_draft.py`). The first row of each stream is the tree written by hand, the baseline of "
        "the drafts below it in the same run. ARI: the adjusted Rand index of the drafted categories against the "
        "hand tree's, over the requests both answer (1 the same grouping, about 0 chance). Right: the learned "
        "judge alone, as the gating replica replays the design arms."
    )
    if large is not None:
        rows.append(Row(f"an export of {LARGE_ROWS:,} rows, read and drafted", "(reported)", large))
    return Section(TITLE, command, lead, rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_output_options(parser)
    parser.add_argument("--streams", default="home,assistant,support", help="of: home, assistant, support")
    options = parser.parse_args(argv)
    from gil_core.local import MiniLMEmbeddingModel

    embedder = MiniLMEmbeddingModel()
    names = [name.strip() for name in options.streams.split(",") if name.strip()]
    results: dict[str, list[Arm]] = {}
    for spec in [spec for spec in STREAMS if spec.name in names]:
        if options.quick:
            spec = replace(spec, size=min(spec.size, 300))
        data = asyncio.run(embed_stream(spec, embedder))
        arms = [_hand_arm(data)]
        drafts = (
            ("drafted from the whole stream", len(data.texts), False),
            (f"drafted from the first {WARMUP} requests", WARMUP, False),
            ("drafted from the whole stream, categories from the key", len(data.texts), True),
        )
        for label, count, categories in drafts:
            rows = _answered(data, count, categories=categories)
            arms.append(asyncio.run(_draft_arm(label, data, rows, embedder)))
            _log(f"{spec.name} / {label}: {arms[-1]}")
        results[spec.name] = arms
    large = None if options.quick else _time_large(embedder, LARGE_ROWS)
    command = COMMAND + (" " + " ".join(argv) if argv else "")
    publish([section(results, command, large)], destination(options))


if __name__ == "__main__":
    main(sys.argv[1:])
