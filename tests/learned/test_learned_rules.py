"""The learned judge's rules and state, on their own: which rule a node's logged evidence supports, withdrawal,
class weights under grouped feedback, the stored state's round trip, and the task file's key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gil_core.errors import LearnedStateError
from gil_core.learned import LearnedState, Logged, MemoryCut, NodeModel, choose_rule, fit_state, read_state, write_state
from gil_core.learned.generation_floor import Generated, GenerationFloor, fit_generation_floor
from gil_core.learned.log import Confirmed, LearnedLog, VerdictDigest
from gil_core.ontology import parse_tree
from gil_core.reporting import next_judge_words
from gil_core.storage import LocalFolder
from gil_core.taskfile import TaskFileError, parse_task_file
from gil_core.tasks import LearnedPolicy
from gil_core.testing import HashEmbeddingModel

TREE = """
id: root
children:
- id: fruit
  description: apples, pears and plums
  options:
  - {id: apple, label: apple, description: a crisp apple, text: An apple.}
  - {id: pear, label: pear, description: a soft pear, text: A pear.}
- id: tools
  description: hammers and saws
  options:
  - {id: hammer, label: hammer, description: a heavy hammer, text: A hammer.}
  - {id: saw, label: saw, description: a sharp saw, text: A saw.}
"""


def logged(right: int, wrong: int, *, llm_right: bool | None = None, confidence: float = 0.9) -> list[Logged]:
    rows = [Logged("root", i, "fruit", "fruit", confidence, 0.9, llm_right) for i in range(right)]
    rows += [Logged("root", right + i, "fruit", "tools", confidence, 0.9, llm_right) for i in range(wrong)]
    return rows


def test_learned_rule_proven_needs_the_lower_bound_to_reach_the_target() -> None:
    few = choose_rule(logged(30, 0), [], threshold=0.5, target=0.95)
    assert few.rule is None and few.lower_bound is not None and few.lower_bound < 0.95  # 30/30: not proven yet
    many = choose_rule(logged(120, 0), [], threshold=0.5, target=0.95)
    assert many.rule == "proven" and many.cut == pytest.approx(0.9)


def test_learned_rule_better_needs_a_significantly_worse_llm_and_the_target_at_the_cut() -> None:
    rows = logged(20, 0)
    pairs = logged(10, 0, llm_right=False)
    better = choose_rule(rows, pairs, threshold=0.5, target=0.95)
    assert better.rule == "better" and better.p_value is not None and better.p_value < 0.05
    as_good = choose_rule(rows, logged(10, 0, llm_right=True), threshold=0.5, target=0.95)
    assert as_good.rule is None  # the LLM was right on the same requests: asking it costs nothing in accuracy


def test_learned_rule_neither_proven_nor_better_serves_nothing() -> None:
    rows = logged(16, 4)  # 80% precise: short of the target at every cut
    choice = choose_rule(rows, logged(16, 4, llm_right=False), threshold=0.5, target=0.95)
    assert choice.rule is None and choice.cut is None


def _tree_log(order: list[str], *, dimensions: int = 64) -> tuple[LearnedLog, dict[str, np.ndarray]]:
    """Confirmed requests given as option ids, embedded with the hash model (words of the option's name)."""
    embedder = HashEmbeddingModel(dimensions)
    words = {
        "apple": "apple crisp red",
        "pear": "pear soft green",
        "hammer": "hammer heavy nail",
        "saw": "saw wood cut",
    }
    vectors = np.asarray(
        [embedder.embed_text(f"{words[o]} request {i}") for i, o in enumerate(order)], dtype=np.float32
    )
    confirmed = tuple(Confirmed(f"t{i}", i, option) for i, option in enumerate(order))
    tree = parse_tree(TREE, source="t.yaml")
    from gil_core.learned import prior_texts

    texts = {
        text
        for node, _ in tree.iter_nodes()
        for item in (node.children or node.options)
        for text in prior_texts(tree, item)
    }
    priors = {text: np.asarray(embedder.embed_text(text), dtype=np.float32) for text in texts}
    return LearnedLog(confirmed, vectors, (), VerdictDigest(len(order), 1)), priors


def _fit(log: LearnedLog, priors: dict[str, np.ndarray], previous: LearnedState | None = None) -> LearnedState:
    tree = parse_tree(TREE, source="t.yaml")
    return fit_state(
        task="t", tree=tree, tree_sha256="a" * 64, threshold=lambda node, layer: 0.5,
        policy=LearnedPolicy(precision=0.95), log=log, priors=priors, embedder="hash", dimensions=64,
        previous=previous,
    )  # fmt: skip


def test_learned_grouped_feedback_keeps_a_category_seen_last_reachable() -> None:
    """Feedback grouped by category (all fruit, no tools confirmed yet): the tools class, known by its prior and
    weighted by its inverse frequency, still wins for a tools request."""
    log, priors = _tree_log(["apple"] * 30 + ["pear"] * 30)
    state = _fit(log, priors)
    root = state.nodes["root"]
    vector = np.asarray(HashEmbeddingModel(64).embed_text("hammer heavy nail request"), dtype=np.float32)
    assert root.predict(vector).choice == "tools"
    assert root.report["rows"] == 60 and root.report["priors"] == 2 + 4


def test_learned_node_is_withdrawn_when_the_log_stops_supporting_its_rule() -> None:
    log, priors = _tree_log(["apple", "hammer"] * 20)
    served = LearnedLog(log.confirmed, log.vectors, tuple(logged(20, 0, llm_right=False)), log.digest)
    state = _fit(served, priors)
    assert state.nodes["root"].rule == "better"
    # Later verdicts: the learned judge was wrong where the LLM was right.
    turned = LearnedLog(log.confirmed, log.vectors, tuple(logged(10, 20, llm_right=True)), log.digest)
    again = _fit(turned, priors, previous=state)
    assert again.nodes["root"].rule == "withdrawn" and not again.nodes["root"].serving
    fresh = _fit(turned, priors)
    assert fresh.nodes["root"].rule == "learning"  # never served: not withdrawn, just not there yet
    restored = _fit(served, priors, previous=again)
    assert restored.nodes["root"].rule == "better"


def test_learned_state_round_trips_and_refuses_another_task(tmp_path: Path) -> None:
    log, priors = _tree_log(["apple", "saw", "pear", "hammer"] * 5)
    state = _fit(log, priors)
    folder = LocalFolder(tmp_path)
    write_state(folder, state, "s.parquet")
    back = read_state(folder, "s.parquet", task="t")
    for node_id, model in state.nodes.items():
        other: NodeModel = back.nodes[node_id]
        assert other.classes == model.classes and other.rule == model.rule
        np.testing.assert_array_equal(other.weights, model.weights)
        np.testing.assert_array_equal(other.exemplars, model.exemplars)
        np.testing.assert_array_equal(other.novelty_cuts, model.novelty_cuts)
    assert back.fitted_on == state.fitted_on and back.tree_sha256 == state.tree_sha256
    assert back.memory is None  # fitted without memory
    memory = MemoryCut("raised", 0.95, 0.9, 40, 30, 30)
    write_state(folder, replace(state, memory=memory), "m.parquet")
    assert read_state(folder, "m.parquet", task="t").memory == memory
    assert state.generation is not None and state.generation.asked == 0 and state.asks_generation  # no verdicts
    floor = GenerationFloor(asked=80, right=0, upper_bound=0.0458, floor=0.05, ask=False)
    write_state(folder, replace(state, generation=floor), "g.parquet")
    back_floor = read_state(folder, "g.parquet", task="t")
    assert back_floor.generation == floor and not back_floor.asks_generation
    assert replace(state, generation=None).asks_generation  # a state written before the floor always asks
    with pytest.raises(LearnedStateError, match="another task"):
        read_state(folder, "s.parquet", task="u")
    (tmp_path / "bad.parquet").write_bytes(b"\x00" * 100)
    with pytest.raises(LearnedStateError, match=r"bad\.parquet: unreadable"):
        read_state(folder, "bad.parquet", task="t")


def test_learned_reflex_key_of_a_task_file(tmp_path: Path) -> None:
    tree = tmp_path / "tree.yaml"
    tree.write_text(TREE, encoding="utf-8")
    base = f"task: t\ntree: {tree}\nthresholds: {{per_layer: [0.5], leaf: 0.5}}\n"
    loaded = parse_task_file(base + "learned_reflex: {precision: 0.97, audit_rate: 0.1}\n", path=tmp_path / "t.yaml")
    assert loaded.task.policy.learned == LearnedPolicy(precision=0.97, audit_rate=0.1)
    assert "learned_reflex" in loaded.task.config()
    assert parse_task_file(base, path=tmp_path / "t.yaml").task.policy.learned is None
    for text, message in (
        ("learned_reflex: {audit_rate: 0.1}", "needs precision"),
        ("learned_reflex: {precision: 1.2}", "precision must lie"),
        ("learned_reflex: {precision: 0.9, shadow: 1}", "unknown key 'shadow'"),
    ):
        with pytest.raises(TaskFileError, match=message) as caught:
            parse_task_file(base + text + "\n", path=tmp_path / "t.yaml")
        assert caught.value.line == 4 and caught.value.key == "learned_reflex"


def test_learned_refit_fits_again_only_the_nodes_feedback_touched() -> None:
    log, priors = _tree_log(["apple", "hammer", "pear", "saw"] * 6)
    first = _fit(log, priors)
    more, _ = _tree_log(["apple", "hammer", "pear", "saw"] * 6 + ["apple", "pear"] * 3)
    second = _fit(more, priors, previous=first)
    assert second.nodes["tools"].weights is first.nodes["tools"].weights  # no new tools verdict: kept
    assert second.nodes["fruit"].weights is not first.nodes["fruit"].weights
    assert second.nodes["root"].weights is not first.nodes["root"].weights


def _asked(node: str, right: int, wrong: int) -> list[Logged]:
    """Requests the learned judge left at a node (not served) and the next judge was asked: ``right`` of them
    settled with the confirmed child."""
    truth = {"root": "fruit", "fruit": "apple", "tools": "hammer"}[node]
    return [
        Logged(node, i, truth, truth, 0.4, 0.9, i < right, served=False) for i in range(right + wrong)
    ]  # fmt: skip


def test_learned_next_judge_is_judged_on_its_layer_then_its_tree_while_it_settled_none_of_a_nodes_own() -> None:
    """40 asks with none right at each of the two leaves: too few on its own for a floor of 5% (upper bound
    8.8%), enough over their layer (80: 4.6%), so both stop asking. 30 at each node: the layer's 60 are too few
    (6.0%), the tree's 90 are not (4.1%). One right at a leaf: that leaf is judged on its own record, and the
    pools' bounds rise over the floor for the others. ``pooling: node`` reads only a node's own."""
    log, priors = _tree_log(["apple", "hammer"] * 20)
    tree = parse_tree(TREE, source="t.yaml")

    def fit(items: list[Logged], pooling: str = "layer") -> dict[str, dict[str, object]]:
        state = fit_state(
            task="t", tree=tree, tree_sha256="a" * 64, threshold=lambda node, layer: 0.5,
            policy=LearnedPolicy(precision=0.95, pooling=pooling), log=replace(log, logged=tuple(items)),  # type: ignore[arg-type]
            priors=priors, embedder="hash", dimensions=64, previous=None,
        )  # fmt: skip
        return {node: state.nodes[node].report["next_judge"] for node in ("root", "fruit", "tools")}

    by_layer = fit(_asked("fruit", 0, 40) + _asked("tools", 0, 40))
    for node in ("fruit", "tools"):
        figures = by_layer[node]
        assert figures["upper_bound"] > 0.05 and figures["pooled_asked"] == 80 and figures["pooled_upper_bound"] < 0.05
        assert figures["ask"] is False and figures["evidence"] == "layer"
    assert by_layer["root"]["ask"] is False and by_layer["root"]["evidence"] == "tree"  # its own: none asked
    words = next_judge_words({"asks_next_judge": False, "next_judge": by_layer["fruit"]})
    assert words == "audits only (0/40 right; layer 0/80)"
    by_tree = fit(_asked("root", 0, 30) + _asked("fruit", 0, 30) + _asked("tools", 0, 30))
    assert all(f["ask"] is False and f["evidence"] == "tree" and f["pooled_asked"] == 90 for f in by_tree.values())
    one_right = fit(_asked("fruit", 0, 40) + _asked("tools", 1, 39))  # 1 of 80 right: 6.7%
    assert one_right["tools"]["ask"] is True and one_right["tools"]["settled_right"] == 1
    assert one_right["fruit"]["ask"] is True and one_right["root"]["ask"] is True
    own_only = fit(_asked("fruit", 0, 40) + _asked("tools", 0, 40), pooling="node")
    assert all(figures["ask"] is True and figures["evidence"] == "node" for figures in own_only.values())


def test_learned_generation_floor_reads_the_latest_unbiased_asks() -> None:
    """Generation is marked only when the Wilson 95% upper bound of its confirmed share, over the latest
    ``window`` asks whose verdicts the queue did not choose, is under the floor; one confirmed answer among 80
    brings it back, queue-chosen verdicts are not read, and a floor of 0 always asks."""
    never = [Generated(i, False) for i in range(80)]
    marked = fit_generation_floor(never, floor=0.05, window=500)
    assert (marked.asked, marked.right, marked.ask) == (80, 0, False) and marked.upper_bound < 0.05
    assert "0 of the latest 80" in marked.describe() and "audits only" in marked.describe()
    assert fit_generation_floor(never[:60], floor=0.05, window=500).ask  # 60 asks cannot show < 5% at 95%
    once = fit_generation_floor([*never, Generated(80, True)], floor=0.05, window=500)
    assert once.ask and once.right == 1
    queued = [Generated(80 + i, True, "queue") for i in range(20)]
    assert not fit_generation_floor([*never, *queued], floor=0.05, window=500).ask  # the queue's verdicts unread
    assert fit_generation_floor([Generated(0, True), *never], floor=0.05, window=80).right == 0  # latest 80 only
    assert fit_generation_floor(never, floor=0.0, window=500).ask
