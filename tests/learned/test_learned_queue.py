"""The feedback queue: what it ranks first, what it never asks about, its random share, how an issued queue is read
back per verdict, and that queue-chosen verdicts train the learned judge without counting as its evidence."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl

from gil_core.batch import Ticket, Verdict, resolve_batch, ticket_trace_id
from gil_core.batch_feedback import apply_verdicts
from gil_core.learned import (
    Confirmed,
    LearnedLog,
    Logged,
    Unconfirmed,
    VerdictDigest,
    choose_queue,
    fit_state,
    issue_queue,
    prior_texts,
    read_chosen_by,
    read_learned_log,
    read_unconfirmed,
    teaching_value,
)
from gil_core.learned.queue import queue_folder
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.ontology import parse_tree
from gil_core.resolver import Resolver
from gil_core.tasks import LearnedPolicy
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel
from tests.learned._support import bad_model, embedder, learned_task, support_stream, train
from tests.learned.test_learned_rules import TREE

WORDS = {"apple": "apple crisp red", "pear": "pear soft green", "hammer": "hammer heavy nail", "saw": "saw wood cut"}
HASH = HashEmbeddingModel(64)


def _vector(text: str) -> np.ndarray:
    vector = np.asarray(HASH.embed_text(text), dtype=np.float32)
    return vector / np.linalg.norm(vector)


def _fitted(order: list[str], logged: tuple[Logged, ...] = (), chosen_by: str = "unsolicited"):  # type: ignore[no-untyped-def]
    tree = parse_tree(TREE, source="t.yaml")
    confirmed = tuple(Confirmed(f"t{i}", i, option, chosen_by=chosen_by) for i, option in enumerate(order))  # type: ignore[arg-type]
    vectors = np.vstack([_vector(f"{WORDS[o]} request {i}") for i, o in enumerate(order)]).astype(np.float32)
    texts = {text for node, _ in tree.iter_nodes() for item in (node.children or node.options)
             for text in prior_texts(tree, item)}  # fmt: skip
    state = fit_state(
        task="t", tree=tree, tree_sha256="a" * 64, threshold=lambda node, layer: 0.5,
        policy=LearnedPolicy(precision=0.95), log=LearnedLog(confirmed, vectors, logged, VerdictDigest(len(order), 1)),
        priors={text: _vector(text) for text in texts}, embedder="hash", dimensions=64, previous=None,
    )  # fmt: skip
    return tree, state


def test_queue_ranks_a_low_margin_trace_ahead_of_a_confident_one() -> None:
    tree, state = _fitted(["apple", "pear", "hammer", "saw"] * 10)
    confident = Unconfirmed("sure", "apple", None, _vector("apple crisp red request 99"))
    torn = Unconfirmed("torn", "apple or hammer", None, _vector("apple crisp hammer heavy request 98"))
    sure_value, torn_value = (teaching_value(c, state, tree) for c in (confident, torn))
    assert torn_value.uncertainty > sure_value.uncertainty
    items = choose_queue([confident, torn], state, tree, size=1, random_share=0.0)
    assert [item.trace_id for item in items] == ["torn"] and items[0].chosen_by == "queue"
    assert items[0].chance == 1.0  # no random share: the best score is chosen for sure


def test_queue_random_share_has_its_size_and_is_drawn_from_all_eligible_traces() -> None:
    tree, state = _fitted(["apple", "pear", "hammer", "saw"] * 10)
    candidates = [
        Unconfirmed(f"c{i}", f"request {i}", None, _vector(f"{WORDS[o]} {'hammer' if i % 3 else ''} {i}"))
        for i, o in enumerate(["apple", "pear", "hammer", "saw"] * 25)
    ]
    drawn: Counter[str] = Counter()
    best: set[str] = set()
    for seed in range(300):
        items = choose_queue(candidates, state, tree, size=10, random_share=0.3, rng=random.Random(seed))
        ways = Counter(item.chosen_by for item in items)
        assert ways == {"queue": 7, "random": 3} and len({item.trace_id for item in items}) == 10
        assert all(item.chance == 3 / 100 for item in items if item.chosen_by == "random")
        drawn.update(item.trace_id for item in items if item.chosen_by == "random")
        best.update(item.trace_id for item in items if item.chosen_by == "queue")
    # Uniform over all 100, the highest-scored included: each is drawn about 9 times in 300 queues.
    assert len(drawn) >= 97 and best <= set(drawn)
    assert max(drawn.values()) < 30


def test_queue_chosen_verdicts_train_the_judge_but_are_not_its_evidence() -> None:
    """200 right predictions at the root prove it when the verdicts were unsolicited or the random share's; the
    same verdicts chosen by the queue leave the root learning, though every one is still a training row."""
    order = ["apple", "pear", "hammer", "saw"] * 50
    truth = ["fruit" if option in ("apple", "pear") else "tools" for option in order]

    def logged(how: str) -> tuple[Logged, ...]:
        return tuple(Logged("root", i, t, t, 0.9, 0.9, None, chosen_by=how) for i, t in enumerate(truth))  # type: ignore[arg-type]

    for how, rule in (("unsolicited", "proven"), ("random", "proven"), ("queue", "learning")):
        _, state = _fitted(order, logged(how), chosen_by=how)
        root = state.nodes["root"]
        assert root.rule == rule, how
        assert root.report["rows"] == len(order)  # training rows: all of them, whichever way chosen
        assert root.report["evidence_rows"] == (0 if how == "queue" else len(order))


async def test_queue_never_holds_do_not_record_traces_and_reads_back_chosen_by_per_verdict(tmp_path: Path) -> None:
    task, stream = learned_task(), support_stream()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await train(resolver, task, 40)  # 40 verdicts given unasked
            await resolve_batch(resolver, task, [Ticket(e.id, e.text) for e in stream[40:70]])
            private = [await resolver.resolve(task, e.text, do_not_record=True) for e in stream[70:74]]
            store = resolver.store
            learner = resolver.learner
            assert learner is not None
            state = await learner.refresh(task)
            eligible = read_unconfirmed(store, task.name, embedder=state.embedder)
            answered = store.read("traces").filter(pl.col("output").is_not_null())["trace_id"].to_list()
            batch = {ticket_trace_id(task.name, e.id) for e in stream[40:70]}
            assert {c.trace_id for c in eligible} == batch & set(answered)  # a failed trace has no answer to check
            assert all(c.vector is not None for c in eligible)
            first = issue_queue(store, task.name, task.tree, state, size=10, random_share=0.3,
                                rng=random.Random(1))  # fmt: skip
            assert not {r.trace_id for r in private} & {item.trace_id for item in first.items}
            assert Counter(item.chosen_by for item in first.items) == {"queue": 7, "random": 3}
            assert len(queue_folder(store, task.name).names()) == 1
            second = issue_queue(store, task.name, task.tree, state, size=30, random_share=0.3)
            assert second.eligible == len(eligible) - 10  # the first queue's traces are asked about once
            assert not {item.trace_id for item in first.items} & {item.trace_id for item in second.items}
            chosen = read_chosen_by(store, task.name)
            expected = {item.trace_id: item.chosen_by for item in first.items + second.items}
            assert chosen == expected
            # Verdicts: on every trace of the first queue, and on one trace resolved after both were issued.
            await resolve_batch(resolver, task, [Ticket("late", "where is my refund?")])
            late = ticket_trace_id(task.name, "late")
            answers = {ticket_trace_id(task.name, e.id): e.answer for e in stream[40:70]}
            verdicts = [Verdict(item.trace_id, False, answers[item.trace_id]) for item in first.items]
            verdicts.append(Verdict(late, False, stream[0].answer))
            verdicts.append(Verdict(late, False, stream[0].answer))  # given twice: one verdict
            await apply_verdicts(resolver, task, verdicts)
    log = read_learned_log(store, task.name, task.tree, none_text=task.language.none_of_these,
                           embedder=state.embedder)  # fmt: skip
    ways = {item.trace_id: item.chosen_by for item in log.confirmed}
    for item in first.items:
        if item.trace_id in ways:  # a procedure's answer names no tree answer: not confirmed here
            assert ways[item.trace_id] == item.chosen_by
    assert ways[late] == "unsolicited" and [item.trace_id for item in log.confirmed].count(late) == 1
    assert {ways[t] for t in ways if t not in expected} == {"unsolicited"}  # the 40 trained on
    order_of = {item.order: item.chosen_by for item in log.confirmed}
    assert all(item.chosen_by == order_of[item.order] for item in log.logged)  # each prediction says it too
    traces = store.read("traces").filter(pl.col("feedback_verdict").is_not_null())
    assert traces.height == 40 + 10 + 1
