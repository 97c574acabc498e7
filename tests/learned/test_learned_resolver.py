"""The learned reflex through the real resolver, store and loopback model: what it serves, when, and what it
records. The model judges badly (tests/learned/_support.py), so what comes out right was learned."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from gil_core.batch import Ticket, resolve_batch, ticket_trace_id
from gil_core.learned import LearnedStateWarning, read_learned_log, task_key, unlike_at_root
from gil_core.learned.rules import served_share
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.ontology import parse_tree
from gil_core.ontology.files import dump_tree
from gil_core.resolver import Resolver
from gil_core.tasks import Resolution
from gil_core.telemetry import TelemetryStore
from tests._compacting import compacting
from tests.learned._support import (
    NONE,
    bad_model,
    deciders_of,
    embedder,
    good_model,
    learned_task,
    recorded,
    resolver_with_memory,
    run_with_feedback,
    support_stream,
    train,
)

REFUND = "Refunds reach the original payment method within 5 business days of approval."


async def test_learned_judge_serves_after_feedback_and_records_what_decided(tmp_path: Path) -> None:
    """Before any verdict the bad model answers; after each round of feedback the learned judge serves one layer
    deeper (a node's evidence starts once the walk reaches it), until whole walks are its own; every step says
    who decided."""
    task = learned_task()
    stream = support_stream()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            first = await run_with_feedback(resolver, task, stream[:40])
            for start in (40, 80, 120):
                await run_with_feedback(resolver, task, stream[start : start + 40])
            later = stream[160:200]
            outputs = await run_with_feedback(resolver, task, later)
    store = resolver.store
    assert sum(first[e.id] == e.answer for e in stream[:40]) == sum(e.answer == NONE for e in stream[:40])
    right = sum(outputs[e.id] == e.answer for e in later)
    assert right >= 34, right  # the bad model alone gets only the out-of-scope ones (about 4 of 40)
    traces = store.read("traces").filter(pl.col("trace_id").is_in([ticket_trace_id("support", e.id) for e in later]))
    assert set(traces["decider"].to_list()) <= {"learned", "llm", "generation"}
    learned_only = traces.filter(pl.col("decider") == "learned")
    assert learned_only.height >= 20
    for row in learned_only.iter_rows(named=True):
        steps = json.loads(row["path"])
        assert all(step["decided_by"] == "learned" and step["learned"]["why"] == "served" for step in steps)
    vectors = store.read("vectors")
    assert vectors.height == 200 and set(vectors["model"]) == {embedder().name}
    assert set(vectors["dimensions"]) == {384}


async def test_learned_judge_answers_none_at_the_root_without_generation(tmp_path: Path) -> None:
    """Requests people confirmed as "none of these" teach the root a none class; served, it answers none with no
    model call at all."""
    task = learned_task()
    stream = support_stream()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await train(resolver, task, 160, chunk=40)
            state = resolver.learner.state("support") if resolver.learner else None
            assert state is not None and None in state.nodes["root"].classes
            out_of_scope = [e for e in stream[160:] if e.category == "root"][:6]
            tickets = [Ticket("again-" + e.id, e.text) for e in out_of_scope]
            await resolve_batch(resolver, task, tickets)
    traces = resolver.store.read("traces").filter(pl.col("mode") == "none")
    assert traces.height >= 1
    calls = resolver.store.read("calls").filter(pl.col("trace_id").is_in(traces["trace_id"].to_list()))
    assert set(calls["role"].to_list()) <= {"embed"}  # no judgment, no generation
    assert set(traces["output"].to_list()) == {NONE}


async def test_learned_node_as_good_as_the_llm_is_not_served(tmp_path: Path) -> None:
    """A model that routes every request right: the learned judge is never significantly better, and too few of
    its predictions are logged to prove the target, so it keeps learning and never serves."""
    task = learned_task(precision=0.99)
    stream = support_stream()[:80]
    with good_model(stream) as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await run_with_feedback(resolver, task, stream[:40])
            await run_with_feedback(resolver, task, stream[40:])
    assert resolver.learner is not None
    state = resolver.learner.state("support")
    assert state is not None
    assert {model.rule for model in state.nodes.values()} == {"learning"}
    decided = {d for e in stream[40:] for d in deciders_of(resolver.store, ticket_trace_id("support", e.id))}
    assert "learned" not in decided


async def test_learned_node_better_than_the_llm_is_reported_so(tmp_path: Path) -> None:
    task = learned_task()
    stream = support_stream()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await run_with_feedback(resolver, task, stream[:40])
    assert resolver.learner is not None
    state = resolver.learner.state("support")
    assert state is not None
    root = state.nodes["root"]
    assert root.rule == "better" and root.cut is not None and root.cut >= 0.6  # from the threshold up
    assert root.report["precision"] >= 0.95
    assert root.report["p_value"] < 0.05 and root.report["llm_precision"] < 0.5


async def test_learned_request_unlike_anything_confirmed_is_not_served(tmp_path: Path) -> None:
    task = learned_task()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await train(resolver, task, 120, chunk=40)
            odd = "The quarterly grain harvest in the northern provinces exceeded forecasts by eleven percent."
            resolution = await resolver.resolve(task, odd)
    root = resolution.path[0]
    assert root.learned is not None and root.learned["why"] == "novel"
    assert root.decided_by == "llm"


async def test_learned_state_is_refit_for_a_changed_tree_and_never_served_stale(tmp_path: Path) -> None:
    task = learned_task()
    stream = support_stream()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            store = TelemetryStore(tmp_path / "store")
            resolver = Resolver(chat, store, reflex_embedder=embedder())
            await run_with_feedback(resolver, task, stream[:40])
            assert resolver.learner is not None
            before = resolver.learner.state("support")
            assert before is not None
            text = dump_tree(task.tree).replace("charges, refunds, invoices", "charges, refunds, bills")
            changed = replace(task, tree=parse_tree(text, source="changed.yaml"))
            fits = resolver.learner.fits
            await resolver.resolve(changed, "where is my refund?")
            after = resolver.learner.state("support")
    assert after is not None and resolver.learner.fits == fits + 1
    assert after.tree_sha256 != before.tree_sha256 and after.key != before.key
    assert after.fitted_on == before.fitted_on  # the same verdicts, a new tree


async def test_learned_log_keeps_corrections_to_an_answer_the_tree_has_reworded_since(tmp_path: Path) -> None:
    task = learned_task()
    stream = support_stream()[:40]
    with bad_model() as server:  # every answer is wrong and corrected in the key's words, the tree's answers
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            store = TelemetryStore(tmp_path / "store")
            await run_with_feedback(Resolver(chat, store, reflex_embedder=embedder()), task, stream)
    reworded = parse_tree(dump_tree(task.tree).replace(REFUND, "Refunds arrive within 3 business days."), source="r")
    before = read_learned_log(store, "support", task.tree, none_text=NONE, embedder=embedder().name)
    after = read_learned_log(store, "support", reworded, none_text=NONE, embedder=embedder().name)
    refunds = [item for item in before.confirmed if item.option == "refund-status"]
    assert refunds and [(i.trace_id, i.option) for i in after.confirmed] == [
        (i.trace_id, i.option) for i in before.confirmed
    ]


async def test_learned_state_fitted_with_another_regularization_is_refit_before_it_serves(tmp_path: Path) -> None:
    """A changed default (or task file) for the classifier's C: the stored state records the policy it was fitted
    with, so the next request refits rather than serve coefficients fitted under the old one."""
    task = learned_task()
    assert task.policy.learned is not None
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            store = TelemetryStore(tmp_path / "store")
            resolver = Resolver(chat, store, reflex_embedder=embedder())
            assert resolver.learner is not None
            await run_with_feedback(resolver, task, support_stream()[:40])
            before = resolver.learner.state("support")
            assert before is not None and before.policy["regularization"] == task.policy.learned.regularization
            learned = replace(task.policy.learned, regularization=task.policy.learned.regularization / 10)
            changed = replace(task, policy=replace(task.policy, learned=learned))
            fits = resolver.learner.fits
            await resolver.resolve(changed, "where is my refund?")
            after = resolver.learner.state("support")
    assert after is not None and resolver.learner.fits == fits + 1
    assert after.policy["regularization"] == learned.regularization
    assert after.fitted_on == before.fitted_on  # the same verdicts, another C
    moved = [node for node, model in after.nodes.items() if not np.allclose(model.weights, before.nodes[node].weights)]
    assert moved, "a tenth of C must change some node's coefficients"


async def test_learned_corrupt_state_file_is_refit_with_a_warning(tmp_path: Path) -> None:
    task = learned_task()
    stream = support_stream()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            store = TelemetryStore(tmp_path / "store")
            resolver = Resolver(chat, store, reflex_embedder=embedder())
            await run_with_feedback(resolver, task, stream[:40])
            folder = tmp_path / "store" / "learned" / task_key("support")
            (newest,) = sorted(folder.glob("*.parquet"))[-1:]
            newest.write_bytes(b"PAR1 not really parquet")
            fresh = Resolver(chat, store, reflex_embedder=embedder())
            with pytest.warns(LearnedStateWarning, match=newest.name):
                resolution = await fresh.resolve(task, "where is my refund?")
    assert fresh.learner is not None and fresh.learner.fits == 1
    assert resolution.path[0].decided_by == "learned"  # the refit state serves the root, as the lost one did
    assert not newest.exists()


async def test_learned_judge_never_trains_on_do_not_record_requests(tmp_path: Path) -> None:
    task = learned_task()
    stream = support_stream()
    private = [e for e in stream[:60] if e.option == "refund-status"]
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            store = TelemetryStore(tmp_path / "store")
            resolver = Resolver(chat, store, reflex_embedder=embedder())
            hidden = []
            for example in private:
                resolution = await resolver.resolve(task, example.text, do_not_record=True)
                hidden.append(resolution.trace_id)
                await resolver.feedback(task, resolution.trace_id, False, example.answer)
            await run_with_feedback(resolver, task, [e for e in stream[:60] if e not in private])
    assert not set(store.read("vectors")["trace_id"].to_list()) & set(hidden)
    log = read_learned_log(store, "support", task.tree, none_text=NONE, embedder=embedder().name)
    assert not {item.trace_id for item in log.confirmed} & set(hidden)
    folder = tmp_path / "store" / "learned" / task_key("support")
    for state_file in folder.glob("*.parquet"):
        for example in private:
            assert example.text.encode() not in state_file.read_bytes()


async def test_learned_states_of_two_tasks_are_isolated(tmp_path: Path) -> None:
    stream = support_stream()
    one, two = learned_task("one"), learned_task("two")
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            store = TelemetryStore(tmp_path / "store")
            resolver = Resolver(chat, store, reflex_embedder=embedder())
            await run_with_feedback(resolver, one, stream[:40])
            await resolver.resolve(two, "where is my refund?")
            assert resolver.learner is not None
            state_one, state_two = resolver.learner.state("one"), resolver.learner.state("two")
            assert state_one is not None and state_two is not None
            assert state_one.fitted_on["verdicts"] == 40 and state_two.fitted_on["verdicts"] == 0
            assert state_two.nodes["root"].report["rows"] == 0
            # A state file of task one put in task two's folder is refused as another task's, and refit.
            source = sorted((tmp_path / "store" / "learned" / task_key("one")).glob("*.parquet"))[-1]
            target = tmp_path / "store" / "learned" / task_key("two")
            stolen = target / (state_two.key + ".99999999999999999999-1-ffffff.parquet")
            stolen.write_bytes(source.read_bytes())
            again = Resolver(chat, store, reflex_embedder=embedder())
            with pytest.warns(LearnedStateWarning, match="another task"):
                await again.resolve(two, "where is my refund?")
    assert again.learner is not None
    refit = again.learner.state("two")
    assert refit is not None and refit.fitted_on["verdicts"] == 0


async def test_learned_walk_fills_a_pattern_slot_without_any_model_call(tmp_path: Path) -> None:
    """Served end to end: the learned judge routes to the order-tracking template, whose order slot is filled by
    its pattern, so the answer costs one embedding and no chat call."""
    task = learned_task(audit_rate=0.0)  # no share of served judgments is put to the LLM as well
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            store = TelemetryStore(tmp_path / "store")
            resolver = Resolver(chat, store, reflex_embedder=recorded(embedder(), store))
            await train(resolver, task, 120, chunk=40)
            resolution = await resolver.resolve(task, "Where is my order 48213? It has not arrived yet.")
            served_by_chat = len(server.requests)
            await resolver.resolve(task, "Where is my order 51177? It has not arrived yet.")
    assert resolution.mode == "habit/template" and "48213" in (resolution.output or "")
    assert [step.decided_by for step in resolution.path] == ["learned", "learned"]
    calls = resolver.store.read("calls").filter(pl.col("trace_id") == resolution.trace_id)
    assert calls["role"].to_list() == ["embed"]
    assert len(server.requests) == served_by_chat  # the second one too: no request reached the model


async def test_learned_judge_overrules_a_memory_hit_it_would_answer_otherwise(tmp_path: Path) -> None:
    """Memory holds a request remembered with the refund answer (a stale entry); a near-identical request is a
    memory hit, but the learned judge would serve a whole walk to order tracking: the hit becomes a miss that says
    why, and the walk answers. No model call either way."""
    task = learned_task(memory_threshold=0.9, audit_rate=0.0)
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver, memory = resolver_with_memory(chat, tmp_path)
            await train(resolver, task, 120, chunk=40)
            await memory.remember(task.name, "stale", "Where is my order 48213? It has not arrived yet.", REFUND)
            asked = len(server.requests)
            again = await resolver.resolve(task, "Where is my order 48213? It still has not arrived.")
    assert again.recall is not None and again.recall.similarity is not None and again.recall.similarity >= 0.9
    assert not again.recall.hit and "learned judge serves track-order" in (again.recall.refused or "")
    assert again.mode == "habit/template" and "48213" in (again.output or "")
    assert len(server.requests) == asked


async def test_learned_refit_while_another_process_compacts_the_log_never_fails(tmp_path: Path) -> None:
    """A refit (before a batch, after feedback) reads the verdicts and their vectors; a compaction deleting those
    files before the read collects them makes it read again instead of failing the batch."""
    task = learned_task(audit_rate=0.0)
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await train(resolver, task, 40, chunk=20)
            learner = resolver.learner
            assert learner is not None
            with compacting(tmp_path / "store", "traces", "vectors") as merged:
                for index, example in enumerate(support_stream()[40:70]):
                    await run_with_feedback(resolver, task, [example], suffix=f"-c{index}")  # new files to merge
                    state = await learner.refresh(task, force=True)
                    assert state.fitted_on["verdicts"] == 41 + index
    assert sum(merged) > 0  # compactions really ran alongside


async def test_a_hit_only_the_lowered_memory_cut_lets_through_is_refused_for_a_request_unlike_the_confirmed(
    tmp_path: Path,
) -> None:
    """After 200 confirmed support requests the log proves memory right far below the configured 0.9, on requests
    like those. Of the requests whose nearest entry lies between the two cuts (held-out support requests, and
    requests of no category of the tree), a hit is refused, saying why, exactly where the learned judge finds the
    request unlike the confirmed requests at the root and the remembered answer is one of the tree's; the others
    are answered from memory. Both happen here."""
    task = learned_task(memory_threshold=0.9, audit_rate=0.0)
    off_topic = ["What's the weather tomorrow?", "Are you hiring?", "Can I pick up my order in a store?",
                 "Do you ship to Mars?", "Can I order by phone?", "my parcel smells funny"]  # fmt: skip
    seen: list[tuple[Resolution, bool]] = []
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver, _ = resolver_with_memory(chat, tmp_path)
            learner = resolver.learner
            assert learner is not None
            await train(resolver, task, 200, chunk=40)
            state = await learner.serving_state(task)
            assert state.memory is not None and state.memory.rule == "proven"
            cut = state.memory.cut
            assert cut is not None and cut < 0.9
            for text in off_topic + [example.text for example in support_stream()[200:300]]:
                resolution = await resolver.resolve(task, text)
                recall = resolution.recall
                if recall is None or recall.similarity is None or not cut <= recall.similarity < 0.9:
                    continue
                unlike = unlike_at_root(state, task.tree, await learner.request_vector(text))
                seen.append((resolution, unlike and recall.answer != task.language.none_of_these))
    for resolution, refused in seen:
        assert resolution.recall is not None
        why = resolution.recall.refused or ""
        if refused:
            assert not resolution.recall.hit and resolution.mode != "memory"
            assert why.startswith("learned: the log's lower memory cut holds"), why
        else:
            assert not why.startswith("learned: the log's lower memory cut holds"), why
    assert {refused for _, refused in seen} == {True, False}
    assert any(resolution.mode == "memory" for resolution, refused in seen if not refused)


async def test_the_root_reports_the_cuts_it_serves_by_once_categories_left_out_raised_them(tmp_path: Path) -> None:
    """The guard for categories the tree does not hold raises the root's novelty cuts after its rule is chosen.
    What the root reports (``gil fit-reflex``: novelty cuts, coverage, what its cuts withhold) is what it serves
    by: the raised cuts, and its logged predictions served or withheld at them (it reported the cuts and coverage
    from before)."""
    task = learned_task(audit_rate=0.0)
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await train(resolver, task, 200, chunk=40)
            state = await resolver.learner.refresh(task, force=True)  # type: ignore[union-attr]
    root = state.nodes["root"]
    floor = root.report["unseen"]["near_cut"]
    cuts = [float(cut) for cut in root.novelty_cuts if not np.isnan(cut)]
    assert root.serving and floor > -1.0 and min(cuts) >= floor and floor in cuts  # raised to the floor
    assert root.report["novelty_cuts"] == [None if np.isnan(cut) else float(cut) for cut in root.novelty_cuts]
    log = read_learned_log(resolver.store, "support", task.tree, none_text=NONE, embedder=embedder().name)
    own = [item for item in log.logged if item.node_id == "root"]
    assert root.cut is not None
    assert root.report["coverage"] == pytest.approx(served_share(root.classes, own, root.cut, root.novelty_cuts))
    # What its cuts keep back, as it serves now: with what it serves, every logged prediction once; and of those
    # kept back for being unlike the confirmed, how many the learned choice had right.
    kept = root.report["withheld"]
    assert kept["novel"][0] + kept["below_cut"][0] + round(root.report["coverage"] * len(own)) == len(own)
    cut_of = dict(zip(root.classes, root.novelty_cuts, strict=True))
    novel = [item for item in own if item.near is None or item.near < cut_of[item.choice]]
    assert kept["novel"] == [len(novel), sum(item.right for item in novel)] and kept["novel"][0] > 0
