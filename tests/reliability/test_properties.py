"""Invariants over generated cases (hypothesis), one level above the unit properties they build on
(tests/judge/test_distribution.py, tests/ontology/test_files.py, tests/telemetry/test_stats.py):

- a whole judgment (ordering, labelling, the model's reply, the recorded call) stays a distribution over the
  labels it showed, keeps the trust rule, and never chooses outside them;
- any tree written to a file loads back equal, whatever characters its texts hold;
- the Wilson interval of every mode in ``gil stats`` lies in [0, 1] around the accuracy;
- the telemetry store never loses or doubles a row while two writers append and compact at the same time.

Example counts are modest so the suite stays within its CI budget.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from gil_core.fallback import TreeAnswerContract
from gil_core.judge import Candidate, SingleTokenJudge
from gil_core.language import ENGLISH
from gil_core.llm import CallRecorder
from gil_core.ontology import LabelScheme, TreeLintWarning, load_tree, write_tree
from gil_core.ontology.model import Node, Option, OptionKind, Origin, Slot, Tree
from gil_core.tasks import TaskDefinition, TaskPolicy
from gil_core.telemetry import EnergyModel, TelemetryStore, TraceRecord
from gil_core.testing import ScriptedChatModel
from gil_core.traverse import Thresholds
from tests.memory._support import ListSink

pytestmark = pytest.mark.reliability

# -- a whole judgment ----------------------------------------------------------------------------------------

_JUNK = ["Z", "the", "", "\n", "AA", " ", "none", "ㄱ", "10", "-"]


@st.composite
def replies(draw: st.DrawFn, scheme: LabelScheme) -> list[tuple[str, float | None]]:
    """A first token's top logprobs as a server sends them: distinct tokens, probabilities summing to at most
    one, some of them labels (with stray white space), some not, some with a null (−∞) logprob."""
    pool = [*scheme.symbols, *(f" {s}" for s in scheme.symbols[:3]), *(f"{s}\n" for s in scheme.symbols[:2]), *_JUNK]
    tokens = draw(st.lists(st.sampled_from(pool), unique=True, max_size=20))
    weights = [draw(st.floats(0.0, 1.0) | st.just(0.0)) for _ in tokens]
    total = sum(weights) + draw(st.floats(0.0, 1.0))  # the rest of the mass goes to tokens not listed
    shares = [weight / total if total > 0 else 0.0 for weight in weights]
    return [(token, math.log(share) if share > 0 else None) for token, share in zip(tokens, shares, strict=True)]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_judgment_is_a_distribution_over_the_shown_labels_and_keeps_the_trust_rule(data: st.DataObject) -> None:
    scheme = data.draw(st.sampled_from(list(LabelScheme)))
    count = data.draw(st.integers(1, scheme.capacity))
    candidates = [Candidate(f"c{i}", f"label {i}", data.draw(st.text(max_size=15))) for i in range(count)]
    reply = data.draw(replies(scheme))
    threshold = data.draw(st.floats(0.0, 1.0))
    seed = data.draw(st.none() | st.text(max_size=5))
    model, sink = ScriptedChatModel(), ListSink()
    model.enqueue(reply[0][0] if reply else "", top_logprobs=reply)
    judge = SingleTokenJudge(
        CallRecorder(model, sink=sink, energy=EnergyModel.tokens()), ENGLISH, trust_threshold=threshold, order_seed=seed
    )
    judgment = asyncio.run(judge.judge("a request", "node", candidates, scheme=scheme))

    shown = judgment.shown
    assert shown[0].id is None and shown[0].shown_as == scheme.none_symbol
    assert sorted(item.id for item in shown[1:]) == sorted(c.id for c in candidates)
    assert len({item.shown_as for item in shown}) == len(shown) and all(
        item.shown_as in scheme.symbols for item in shown
    )
    got = judgment.distribution
    assert set(got.probs) == {c.id for c in candidates}
    if got.label_mass > 0:
        assert math.isclose(sum(got.probs.values()) + got.none_prob, 1.0, rel_tol=1e-9)
    assert 0.0 <= got.label_mass <= 1.0 + 1e-9
    assert got.trusted == (got.label_mass >= threshold)
    assert judgment.choice is None or judgment.choice in got.probs  # never a label it did not show
    if judgment.choice is not None:
        assert got.trusted and got.probs[judgment.choice] == got.confidence == max(got.probs.values())
        assert got.confidence >= got.none_prob
    (call,) = sink.calls
    assert (call.distribution, call.label_mass, call.outcome) == (got.probs, got.label_mass, got.outcome)


# -- trees through files -------------------------------------------------------------------------------------

# Any character a file can hold (surrogates cannot be UTF-8), control characters and line breaks included.
_ANY_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_YAML_LOOKALIKES = st.sampled_from(["yes", "No", "null", "~", "1e3", "0x1F", "- x", "a: b", "#c", "{x}", "|", "\x85"])


@st.composite
def wide_trees(draw: st.DrawFn) -> Tree:
    texts = _ANY_TEXT | _YAML_LOOKALIKES
    fresh = iter(range(1000))

    def text() -> str:
        return draw(texts)

    def an_id(prefix: str) -> str:
        return f"{prefix}{next(fresh)}{draw(texts)}"

    def option() -> Option:
        kind = draw(st.sampled_from(list(OptionKind)))
        common: dict[str, Any] = {"id": an_id("o"), "label": text(), "description": text()}
        common["origin"] = draw(st.sampled_from(list(Origin)))
        if kind is OptionKind.ANSWER:
            return Option(kind=kind, text=text(), **common)
        if kind is OptionKind.PROCEDURE:
            return Option(kind=kind, steps=text(), **common)
        slots = (Slot("s", "fixed", text()), Slot("t", text() or "ask"))
        prefix = text().replace("{", "(").replace("}", ")")  # blanks other than {s} and {t} would be an error
        return Option(kind=kind, template=f"{prefix}{{s}} {{t}}", slots=slots, **common)

    def leaf() -> Node:
        scheme = draw(st.sampled_from(list(LabelScheme)))
        options = tuple(option() for _ in range(draw(st.integers(1, 3))))
        return Node(id=an_id("n"), label=text(), description=text(), label_scheme=scheme, options=options)

    children = tuple(leaf() for _ in range(draw(st.integers(1, 3))))
    return Tree(Node(id=an_id("root"), description=text(), children=children))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=wide_trees())
def test_any_tree_written_to_a_file_loads_back_equal_and_hashes_the_same(tree: Tree) -> None:
    with tempfile.TemporaryDirectory() as directory, warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        path = Path(directory) / "tree.yaml"
        write_tree(tree, path)
        again = load_tree(path)
        write_tree(again, path.with_name("again.yaml"))
        assert path.with_name("again.yaml").read_bytes() == path.read_bytes()
    assert again.root == tree.root
    policy = TaskPolicy(thresholds=Thresholds(per_layer=(0.5,), leaf=0.5))
    configs = [TaskDefinition("t", TreeAnswerContract(t), t, policy).config() for t in (tree, again)]
    assert configs[0] == configs[1]  # the tree's hash in run_configs does not change on a round trip


def test_a_next_line_character_survives_a_tree_file() -> None:
    """U+0085 reads as a line break in YAML 1.1; it used to come back as a space (or "\\n" in a block)."""
    texts = ["a\x85b", "a\nb\x85c", "\x85"]
    tree = Tree(Node(id="root", options=tuple(Option(id=f"o{i}", text=t, description=t) for i, t in enumerate(texts))))
    with tempfile.TemporaryDirectory() as directory:
        write_tree(tree, Path(directory) / "tree.yaml")
        assert [option.text for option in load_tree(Path(directory) / "tree.yaml").root.options] == texts


# -- Wilson intervals in gil stats --------------------------------------------------------------------------

_MODES = ["memory", "habit/answer", "partial", "fallback", "abstain"]
_START = datetime(2026, 1, 1, tzinfo=UTC)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_MODES), st.sampled_from([None, "correct", "wrong"])), max_size=60))
def test_every_mode_in_the_stats_has_a_wilson_interval_in_0_1_around_its_accuracy(
    traces: list[tuple[str, str | None]],
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = TelemetryStore(directory)
        for index, (mode, verdict) in enumerate(traces):
            record = TraceRecord(
                f"t{index}", _START + timedelta(seconds=index), "task", "q", mode, feedback_verdict=verdict
            )
            store.record_trace(record)
        stats = store.stats("task", window=10)
    judged = Counter(mode for mode, verdict in traces if verdict is not None)
    correct = Counter(mode for mode, verdict in traces if verdict == "correct")
    assert {m.mode: m.requests for m in stats.modes} == Counter(mode for mode, _ in traces)
    for mode in stats.modes:
        assert (mode.judged, mode.correct) == (judged[mode.mode], correct[mode.mode])
        if mode.judged == 0:
            assert mode.accuracy is mode.low is mode.high is None
        else:
            assert mode.accuracy is not None and mode.low is not None and mode.high is not None
            assert 0.0 <= mode.low <= mode.accuracy <= mode.high <= 1.0


# -- the store under interleaved writers and compactions -------------------------------------------------------

_OPERATION = st.one_of(
    st.tuples(st.just("trace"), st.integers(0, 2), st.sampled_from(_MODES)),
    st.tuples(st.just("reviews"), st.integers(1, 3)),
    st.tuples(st.just("count"), st.sampled_from(["root", "billing"]), st.integers(1, 3)),
    st.tuples(st.just("compact"), st.sampled_from(["traces", "reviews", "node_stats"])),
)


class _InFlight:
    """Counts the store calls in progress; ``overlapped`` says whether both writers' calls ever were at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = 0
        self.overlapped = False

    def __enter__(self) -> None:
        with self._lock:
            self._now += 1
            self.overlapped |= self._now == 2

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._now -= 1


class TwoWritersAndCompactions(RuleBasedStateMachine):
    """Two store objects on one root (as two processes would be) append, supersede and compact at the same time:
    each step, one operation per writer, started together from a barrier on two threads. A third, fresh reader
    and both writers then read exactly what was acknowledged. ``rounds`` and ``overlapping`` (class-wide) count
    the steps, and those in which both writers' calls were in progress at once."""

    rounds = 0
    overlapping = 0

    @initialize()
    def open_store(self) -> None:
        self.directory = tempfile.TemporaryDirectory()
        root = Path(self.directory.name)
        self.writers = [TelemetryStore(root), TelemetryStore(root)]
        self.root = root
        self.traces: dict[str, str] = {}  # trace_id → mode last written
        self.reviews: Counter[str] = Counter()
        self.hits: Counter[str] = Counter()
        self.clock = 0

    def teardown(self) -> None:
        if hasattr(self, "directory"):
            self.directory.cleanup()

    def _now(self) -> datetime:
        self.clock += 1
        return _START + timedelta(microseconds=self.clock)

    def _call(self, writer: int, operation: tuple[Any, ...]) -> Callable[[], object]:
        """The store call ``operation`` makes for ``writer``, its model updated once both calls returned. Each
        writer records its own traces (``w0-t1``…), so the last write of each is well defined."""
        store, kind = self.writers[writer], operation[0]
        if kind == "trace":
            trace_id, mode = f"w{writer}-t{operation[1]}", operation[2]
            self.traces[trace_id] = mode
            record = TraceRecord(trace_id, self._now(), "task", "q", mode)
            return lambda: store.record_trace(record)
        if kind == "reviews":
            ids = [f"w{writer}-r{sum(self.reviews.values()) + i}" for i in range(operation[1])]
            self.reviews.update(ids)
            at = self._now()
            rows = [{"task": "t", "reviewed_at": at, "kind": "k", "item_id": i, "decision": "d"} for i in ids]
            return lambda: store.append("reviews", rows)
        if kind == "count":
            node, hits = operation[1], operation[2]
            self.hits[node] += hits
            row = {
                "scope": "task",
                "node_id": node,
                "hits": hits,
                "accepts": 0,
                "exits": 0,
                "last_used_at": self._now(),
            }
            return lambda: store.append("node_stats", [row])
        return lambda: store.compact(operation[1])

    @rule(first=_OPERATION, second=_OPERATION)
    def both_writers_at_once(self, first: tuple[Any, ...], second: tuple[Any, ...]) -> None:
        calls = [self._call(0, first), self._call(1, second)]
        barrier, in_flight, errors = threading.Barrier(2), _InFlight(), []

        def run(call: Callable[[], object]) -> None:
            barrier.wait(timeout=30)
            try:
                with in_flight:
                    call()
            except BaseException as exc:  # re-raised in the test's thread below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(call,)) for call in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        if errors:
            raise errors[0]
        TwoWritersAndCompactions.rounds += 1
        TwoWritersAndCompactions.overlapping += in_flight.overlapped

    @invariant()
    def every_reader_sees_exactly_what_was_written(self) -> None:
        if not hasattr(self, "writers"):
            return
        for reader in (*self.writers, TelemetryStore(self.root)):
            traces = reader.read("traces")
            assert dict(zip(traces["trace_id"], traces["mode"], strict=True)) == self.traces
            assert traces.height == len(self.traces)
            assert Counter(reader.read("reviews")["item_id"].to_list()) == self.reviews  # each row once
            stats = reader.read("node_stats")
            assert dict(zip(stats["node_id"], stats["hits"], strict=True)) == dict(self.hits)


@pytest.mark.slow
def test_the_store_under_two_writers_and_compactions_at_once_keeps_every_acknowledged_row() -> None:
    """The state machine above; and its writers did overlap: in most steps both calls were in progress at once
    (a step whose two calls both return at once, say two compactions of an empty table, may not)."""
    TwoWritersAndCompactions.rounds = TwoWritersAndCompactions.overlapping = 0
    run_state_machine_as_test(
        TwoWritersAndCompactions, settings=settings(max_examples=15, stateful_step_count=12, deadline=None)
    )
    rounds, overlapping = TwoWritersAndCompactions.rounds, TwoWritersAndCompactions.overlapping
    assert rounds > 0 and overlapping * 2 > rounds, f"{overlapping} of {rounds} steps overlapped"
