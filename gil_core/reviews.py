"""Review rounds as a person sees them: a list of items to accept or reject, and what a decision does.

A round (promotion, deactivation, differentiation) reads the log and writes its list as YAML. ``decide`` records
one decision in the review log and, for an accepted promotion or retirement, edits the tree file in place, its
comments and key order kept (the ``gil review decide`` command). ``apply_decisions`` takes a whole round's
decisions at once (the form of a paused Prefect round): it records them all, writes what was accepted into a new
version of the tree file beside the old one (the compact writer), and records the promotion round at the index
its proposals were computed at.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gil_core.atomic import atomic_write_text
from gil_core.errors import ConfigurationError, TreeFileError
from gil_core.habits.costs import CostModelError
from gil_core.habits.deactivation import (
    DeactivationPolicy,
    ReliabilityWeights,
    prepare_deactivation_round,
)
from gil_core.habits.differentiation import DifferentiationPolicy, prepare_differentiation_round
from gil_core.habits.promotion import (
    PromotionLog,
    PromotionPolicy,
    Proposal,
    prepare_promotion_round,
    review_promotions,
)
from gil_core.habits.review_log import Decision, ReviewDecision, ReviewKind, ReviewLog
from gil_core.llm import EmbeddingModel
from gil_core.ontology import Tree, dump_tree
from gil_core.ontology.roundtrip import edited_tree_text
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore

__all__ = [
    "DEFAULT_DEACTIVATION",
    "DEFAULT_DIFFERENTIATION",
    "DEFAULT_PROMOTION",
    "DEFAULT_WEIGHTS",
    "AppliedDecisions",
    "ItemDecision",
    "ReviewList",
    "apply_decisions",
    "deactivation_review",
    "decide",
    "differentiation_review",
    "promotion_review",
    "review_file_name",
    "safe_name",
    "write_tree_version",
]

_PLAIN_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")
_NOT_PLAIN = re.compile(r"[^A-Za-z0-9_.-]+")
_LIKE_ESCAPED = re.compile(r"(?:.*-)?[0-9A-Fa-f]{12}")  # what an escaped name looks like: ends in 12 hex digits


def safe_name(name: str, plain: re.Pattern[str] = _PLAIN_FILE_NAME) -> str:
    """``name`` as one plain piece of a file name or key: itself when it matches ``plain`` whole (by default
    letters, digits, ``_ . -``, not starting with a dot, at most 64 characters), else its plain characters (the
    others as ``_``, at most 40) and 12 hex digits of its SHA-256, so that no task name reaches outside a folder
    (``../x``, ``/etc``, ``a/b``, NUL, a name longer than a file name may be) and two names never share a file.
    A plain name that looks escaped (``alpha-0bd0509bafa4`` is how ``alpha `` comes out) is escaped too, or it
    would share the other's file."""
    if plain.fullmatch(name) and not _LIKE_ESCAPED.fullmatch(name):
        return name
    readable = _NOT_PLAIN.sub("_", name).strip("._")[:40]
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{readable}-{digest}" if readable else digest


def review_file_name(task: str, kind: ReviewKind | str) -> str:
    """The file a round's review list is written to, in the reviews folder: ``<task>-<kind>.yaml``, the task
    name escaped by ``safe_name``."""
    return f"{safe_name(task)}-{ReviewKind(kind).value}.yaml"


DEFAULT_PROMOTION = PromotionPolicy(min_support=3, from_corrections=False)
DEFAULT_WEIGHTS = ReliabilityWeights(reinforce=1.0, penalty=2.0, prior_strength=2.0)
DEFAULT_DEACTIVATION = DeactivationPolicy(
    half_life=500.0, stale_below=0.05, reliability_below=0.4, min_verdicts=5, dispute_rate=0.3, min_explored=3
)
DEFAULT_DIFFERENTIATION = DifferentiationPolicy(headroom=2, min_support=3, similarity=0.8, unserved_min_support=3)


@dataclass(frozen=True)
class ReviewList:
    """What a round proposes: one mapping per item, each with an ``id`` a decision names. A promotion round also
    says at which trace index (how many requests of the task) its proposals were computed; ``note``, why a round
    could propose nothing yet (a log too young to price a habit)."""

    kind: ReviewKind
    task: str
    items: list[dict[str, Any]]
    at_index: int | None = None
    note: str | None = None

    def to_yaml(self) -> str:
        data: dict[str, Any] = {"kind": self.kind.value, "task": self.task}
        if self.at_index is not None:
            data["at_index"] = self.at_index
        if self.note is not None:
            data["note"] = self.note
        return yaml.safe_dump({**data, "items": self.items}, sort_keys=False, allow_unicode=True)

    def describe(self, item: dict[str, Any]) -> str:
        """One line saying what accepting ``item`` would do, for a form or a table."""
        if self.kind is ReviewKind.PROMOTION:
            return (
                f"make “{_shortened(item['text'])}” a habit of {item['anchor']} (confirmed {item['support']}×, "
                f"net saving {item['net_saving']:.3g} per round of requests)"
            )
        if self.kind is ReviewKind.DEACTIVATION:
            return f"retire habit {item['id']} of {item['anchor']} ({item['reason']}, reliability {item['score']:.2f})"
        details = ", ".join(f"{key} {value}" for key, value in item.items() if key not in ("id", "signal"))
        return f"{item['signal']}: {_shortened(details, 120)}"

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, self.to_yaml())
        return path


def promotion_review(
    store: TelemetryStore, task: TaskDefinition, policy: PromotionPolicy = DEFAULT_PROMOTION
) -> ReviewList:
    """Recurring confirmed answers worth making habits (net saving > 0), best first; none, with a note saying why,
    while the log holds too few judge calls to price a habit (a young task: a scheduled round is not a failure)."""
    try:
        round_ = store.rescanning(  # reads only: read again when a concurrent compaction deletes a file mid-read
            lambda: prepare_promotion_round(store, task.name, task.tree, policy, none_text=task.language.none_of_these)
        )
    except CostModelError as exc:
        note = f"nothing proposed yet: a habit is priced from the judge calls in the log, and {exc}"
        return ReviewList(ReviewKind.PROMOTION, task.name, [], note=note)
    items = [
        {**asdict(proposal), "sources": list(proposal.sources), "net_saving": proposal.net_saving}
        for proposal in round_.proposals.proposals
    ]
    return ReviewList(ReviewKind.PROMOTION, task.name, items, at_index=round_.at_index)


def deactivation_review(
    store: TelemetryStore,
    task: TaskDefinition,
    weights: ReliabilityWeights = DEFAULT_WEIGHTS,
    policy: DeactivationPolicy = DEFAULT_DEACTIVATION,
) -> ReviewList:
    """Habits to retire: unreliable, disputed or stale, each under its heaviest reason."""
    proposals = store.rescanning(  # reads only: read again when a concurrent compaction deletes a file mid-read
        lambda: prepare_deactivation_round(store, task.name, task.tree, weights, policy)
    )
    return ReviewList(ReviewKind.DEACTIVATION, task.name, [asdict(proposal) for proposal in proposals])


async def differentiation_review(
    store: TelemetryStore,
    task: TaskDefinition,
    embedder: EmbeddingModel,
    policy: DifferentiationPolicy = DEFAULT_DIFFERENTIATION,
) -> ReviewList:
    """Categories to split (near capacity), answers anchored too high, and unserved requests to add a category for."""
    report = await prepare_differentiation_round(
        store, task.name, task.tree, policy, none_text=task.language.none_of_these, embedder=embedder
    )
    items: list[dict[str, Any]] = []
    items += [{"id": signal.id, "signal": "capacity", **asdict(signal)} for signal in report.capacity]
    items += [{"id": signal.id, "signal": "anchored", **_plain(asdict(signal))} for signal in report.anchored]
    items += [
        {"id": f"unserved-{index}", "signal": "unserved", "support": group.support, **_plain(asdict(group))}
        for index, group in enumerate(report.unserved, start=1)
    ]
    return ReviewList(ReviewKind.DIFFERENTIATION, task.name, items)


def _plain(data: dict[str, Any]) -> dict[str, Any]:
    return {
        key: list(value) if isinstance(value, tuple) else str(value) if hasattr(value, "value") else value
        for key, value in data.items()
    }


@dataclass(frozen=True, slots=True)
class ItemDecision:
    """A person's decision on one item of a review list; ``note`` says why (kept in the review log)."""

    item_id: str
    decision: Decision
    note: str | None = None


@dataclass(frozen=True)
class AppliedDecisions:
    """What a round's decisions did: the entries recorded in the review log, the new tree and the file it was
    written to (None when nothing accepted changes the tree), the accepted items the tree could not take (item id
    → why; they are recorded as deferred, so the next round asks again), and the promotion round's index."""

    recorded: list[ReviewDecision]
    tree: Tree | None = None
    tree_file: Path | None = None
    refused: dict[str, str] = field(default_factory=dict)
    at_index: int | None = None


@dataclass(frozen=True)
class _Change:
    tree: Tree | None
    promoted: tuple[Proposal, ...]
    refused: dict[str, str]
    at_index: int | None


def _accepted_change(
    store: TelemetryStore, task: TaskDefinition, kind: ReviewKind, accepted: Sequence[str], at_index: int | None
) -> _Change:
    """The tree with ``accepted`` items applied (None: unchanged), what was promoted, and what was refused."""
    if kind is ReviewKind.PROMOTION and accepted:
        round_ = prepare_promotion_round(
            store, task.name, task.tree, DEFAULT_PROMOTION, none_text=task.language.none_of_these, at_index=at_index
        )
        proposals = {proposal.id: proposal for proposal in round_.proposals.proposals}
        refused = {
            item: f"no promotion proposal {item!r} in the round at index {round_.at_index}"
            for item in accepted
            if item not in proposals
        }
        review = review_promotions(task.tree, [proposals[item] for item in accepted if item in proposals])
        refused |= {p.proposal.id: f"proposal {p.proposal.id!r} refused ({p.reason.value})" for p in review.refused}
        return _Change(review.tree if review.applied else None, review.applied, refused, round_.at_index)
    if kind is ReviewKind.DEACTIVATION and accepted:
        tree, refused = task.tree, {}
        for item in accepted:
            if tree.has_option(item):
                tree = _without_option(tree, item)
            else:
                refused[item] = f"the tree has no habit {item!r} to retire"
        return _Change(tree if tree is not task.tree else None, (), refused, at_index)
    return _Change(None, (), {}, at_index)


def decide(
    store: TelemetryStore,
    task: TaskDefinition,
    kind: ReviewKind | str,
    item_id: str,
    decision: Decision | str,
    note: str | None = None,
) -> Tree | None:
    """Record a decision. An accepted promotion adds the habit to the tree file, an accepted retirement removes
    the habit from it; both return the new tree, written to ``task.tree.source`` in place, its comments, key order
    and layout kept (``gil_core.ontology.roundtrip``). Others return None. The edit is computed before anything is
    recorded: a tree file that cannot take it (changed meanwhile, past the bounds) raises ``TreeFileError``."""
    kind, decision = ReviewKind(kind), Decision(decision)
    accepted = [item_id] if decision is Decision.ACCEPTED else []
    change = _accepted_change(store, task, kind, accepted, None)
    if item_id in change.refused:
        raise ConfigurationError(f"task {task.name!r}: {change.refused[item_id]}")
    source = task.tree.source
    edited = edited_tree_text(source, task.tree, change.tree) if change.tree is not None and source else None
    if change.promoted and change.at_index is not None:
        PromotionLog(store).record(task.name, change.at_index, change.promoted)
    ReviewLog(store).record(task.name, kind, item_id, decision, note)
    if edited is not None and source:
        _write_tree_text(source, edited)
    return change.tree


def apply_decisions(
    store: TelemetryStore, task: TaskDefinition, review: ReviewList, decisions: Sequence[ItemDecision]
) -> AppliedDecisions:
    """Apply a round's decisions at once, each naming an item of ``review``.

    What was accepted goes into a new version of the tree file, written beside ``task.tree.source`` (never over
    it: the task file keeps naming the old one until a person switches it). A promotion round is recorded at
    ``review.at_index`` with what it promoted, and its proposals are recomputed at that index, so they are the
    ones the person saw. Every decision goes into the review log in one write; an accepted item the tree cannot
    take is recorded as deferred, with the reason. An item id that is not in ``review`` raises
    ``ConfigurationError`` before anything is written.
    """
    known = {str(item["id"]) for item in review.items}
    seen: set[str] = set()
    for entry in decisions:
        if entry.item_id not in known:
            raise ConfigurationError(f"task {task.name!r}: {review.kind.value} review has no item {entry.item_id!r}")
        if entry.item_id in seen:
            raise ConfigurationError(f"task {task.name!r}: item {entry.item_id!r} is decided twice")
        seen.add(entry.item_id)
    accepted = [entry.item_id for entry in decisions if entry.decision is Decision.ACCEPTED]
    change = _accepted_change(store, task, review.kind, accepted, review.at_index)
    tree_file = write_tree_version(change.tree, task.tree.source) if change.tree and task.tree.source else None
    if review.kind is ReviewKind.PROMOTION and review.at_index is not None and decisions:
        PromotionLog(store).record(task.name, review.at_index, change.promoted)
    rows = [
        (entry.item_id, Decision.DEFERRED, f"accepted, not applied: {change.refused[entry.item_id]}")
        if entry.item_id in change.refused
        else (entry.item_id, entry.decision, entry.note)
        for entry in decisions
    ]
    recorded = ReviewLog(store).record_all(task.name, review.kind, rows)
    return AppliedDecisions(recorded, change.tree, tree_file, change.refused, review.at_index)


_VERSION = re.compile(r"^(?P<stem>.+)\.v(?P<number>\d+)$")


def write_tree_version(tree: Tree, source: str | Path) -> Path:
    """Write ``tree`` (compact YAML, so it diffs cleanly against ``source``) as the next version beside
    ``source``: ``support.yaml`` → ``support.v2.yaml`` → ``support.v3.yaml``; an existing file is never
    overwritten, and the new one appears whole (``gil_core.atomic``)."""
    source = Path(source)
    match = _VERSION.match(source.stem)
    stem, number = (match["stem"], int(match["number"])) if match else (source.stem, 1)
    text = dump_tree(tree)
    while True:
        number += 1
        path = source.with_name(f"{stem}.v{number}{source.suffix}")
        try:
            _write_tree_text(path, text, overwrite=False)
            return path
        except FileExistsError:
            continue


def _write_tree_text(path: str | Path, text: str, *, overwrite: bool = True) -> None:
    """Write a tree file atomically; a failure (a folder in the way, no space) is a ``TreeFileError`` naming it.
    ``FileExistsError`` (``overwrite=False`` and the file is there) is raised as it is, for the caller to pick
    another name."""
    try:
        atomic_write_text(path, text, overwrite=overwrite)
    except FileExistsError:
        raise
    except OSError as exc:
        raise TreeFileError(f"cannot write the tree file ({type(exc).__name__}: {exc})", path=str(path)) from exc


def _shortened(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _without_option(tree: Tree, option_id: str) -> Tree:
    owner = tree.owner(option_id)

    def rebuild(node: Any) -> Any:
        if node.id == owner.id:
            return replace(node, options=tuple(o for o in node.options if o.id != option_id))
        return replace(node, children=tuple(rebuild(child) for child in node.children))

    return Tree(rebuild(tree.root), source=tree.source)
