"""Memory after the tree is edited: an entry standing for an answer the tree has changed or removed is no longer served
(the next nearest entry standing for what the tree gives now is), while answers the tree still gives, a person's own
words and "none of these" are.

Each test resolves and confirms through the real resolver, the scripted OpenAI-compatible server on loopback, a real
LanceDB memory and the Parquet store; the edit is a changed copy of ontologies/support.yaml loaded anew.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import polars as pl

from gil_core.fallback import TreeAnswerContract
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.memory import LanceDBMemory
from gil_core.ontology import Tree, TreeLintWarning, load_tree
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel
from tests.resolver._support import ROOT, Script, support_server, support_task

REFUND = "where is my refund?"
REFUND_TEXT = "Refunds reach the original payment method within 5 business days of approval."
REWORDED = "Refunds reach the original payment method within 3 business days of approval."
EMAIL = "please change the email on my account"
STEPS = "Confirm the current address, send a code to the new one, and switch only after the code is entered."
PROCEDURE_ANSWER = "I have sent a code to your new address; the change takes effect once you enter it."
COST = "what does shipping cost?"
COST_TEXT = "Shipping is free above 50 and 5 below that."


def edited(tmp_path: Path, old: str, new: str) -> TaskDefinition:
    """The support task with its tree file changed: ``old`` replaced by ``new`` (exactly once)."""
    text = (ROOT / "ontologies" / "support.yaml").read_text(encoding="utf-8")
    assert text.count(old) == 1
    path = tmp_path / f"support-{abs(hash(new))}.yaml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        tree: Tree = load_tree(path)
    task = support_task()
    return replace(task, tree=tree, contract=TreeAnswerContract(tree))


@asynccontextmanager
async def resolving(tmp_path: Path, scripts: Mapping[str, Script]) -> AsyncIterator[tuple[Resolver, LanceDBMemory]]:
    """A resolver over the scripted server, a LanceDB memory and a store in ``tmp_path``, and its memory."""
    with support_server(scripts) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel())
            yield Resolver(chat, TelemetryStore(tmp_path / "store"), memory=memory), memory


def versions(store: TelemetryStore) -> dict[str, str | None]:
    judged = store.read("traces").filter(pl.col("feedback_verdict").is_not_null())
    return dict(zip(judged["trace_id"], judged["answer_version"], strict=True))


async def test_a_reworded_answer_is_no_longer_served_from_memory_and_the_new_words_are_learned(tmp_path: Path) -> None:
    task = support_task()
    async with resolving(tmp_path, {REFUND: Script(route=["billing", "refund status"])}) as (resolver, memory):
        first = await resolver.resolve(task, REFUND)
        assert (first.mode, first.output) == ("habit/answer", REFUND_TEXT)
        await resolver.feedback(task, first.trace_id, correct=True)
        assert versions(resolver.store)[first.trace_id] == task.tree.option("refund-status").answer_version
        assert (await resolver.resolve(task, REFUND)).mode == "memory"  # the tree unchanged: served

        # A description is what the judge is shown, not the answer: memory goes on serving.
        described = edited(tmp_path, "asks where a refund is or when it arrives", "asks about a refund's progress")
        assert (await resolver.resolve(described, REFUND)).mode == "memory"

        reworded = edited(tmp_path, REFUND_TEXT, REWORDED)
        after = await resolver.resolve(reworded, REFUND)
        assert (after.mode, after.output) == ("habit/answer", REWORDED)
        assert after.recall is not None and not after.recall.hit and after.recall.source == first.trace_id
        assert after.recall.refused == (
            "tree: the remembered answer was the tree's 'refund-status', which the tree has changed since"
        )
        assert [entry.answer for entry in await memory.entries(task.name)] == [REFUND_TEXT]  # kept, not served

        await resolver.feedback(reworded, after.trace_id, correct=True)
        refusals = resolver.store.stats(task.name, window=10).memory_refused
        assert [(r.check, r.hits, r.judged, r.remembered_wrong, r.answered_right) for r in refusals] == [
            ("tree changed", 1, 1, 1, 1)  # serving the old words would have been wrong by the new verdict
        ]
        # The old entry is as near (and remembered earlier), but the next nearest stands for the tree's answer now.
        again = await resolver.resolve(reworded, REFUND)
        assert (again.mode, again.output) == ("memory", REWORDED)
        assert again.recall is not None and again.recall.source == after.trace_id and again.recall.refused is None
        # Back to the old tree: the old entry serves again, and the new words are not its answer.
        back = await resolver.resolve(task, REFUND)
        assert (back.mode, back.output) == ("memory", REFUND_TEXT)
        assert back.recall is not None and back.recall.source == first.trace_id


async def test_a_removed_answer_is_refused_and_a_rebuild_leaves_it_out(tmp_path: Path) -> None:
    task = support_task()
    own_words = "We are sorry: shipping prices are on the pricing page."
    scripts = {
        REFUND: Script(route=["billing", "refund status"]),
        COST: Script(route=["shipping", "shipping cost"]),
    }
    async with resolving(tmp_path, scripts) as (resolver, memory):
        refund = await resolver.resolve(task, REFUND)
        await resolver.feedback(task, refund.trace_id, correct=True)
        cost = await resolver.resolve(task, COST)
        await resolver.feedback(task, cost.trace_id, correct=False, correction=own_words)
        assert versions(resolver.store)[cost.trace_id] is None  # a person's own words: no tree answer

        block = (
            "  - id: refund-status\n    label: refund status\n"
            "    description: asks where a refund is or when it arrives\n"
            f"    text: {REFUND_TEXT}\n"
        )
        removed = edited(tmp_path, block, "")
        refused = await resolver.resolve(removed, REFUND)
        assert refused.recall is not None and refused.recall.refused == (
            "tree: the remembered answer was the tree's 'refund-status', which the tree no longer has"
        )
        served = await resolver.resolve(removed, COST)  # own words stand whatever the tree says
        assert (served.mode, served.output) == ("memory", own_words)

        assert await resolver.rebuild_memory(removed) == 1  # the refund's verdict is left out
        assert [entry.answer for entry in await memory.entries(task.name)] == [own_words]
        assert await resolver.rebuild_memory(task) == 2  # under the tree it was confirmed for, it is back


async def test_a_correction_to_a_tree_answer_stands_for_that_answer(tmp_path: Path) -> None:
    task = support_task()
    async with resolving(tmp_path, {COST: Script(route=["shipping", "delivery time"])}) as (resolver, _):
        wrong = await resolver.resolve(task, COST)
        assert wrong.output == "Standard delivery takes 3 to 5 business days."
        await resolver.feedback(task, wrong.trace_id, correct=False, correction=COST_TEXT)
        assert versions(resolver.store)[wrong.trace_id] == task.tree.option("shipping-cost").answer_version
        assert (await resolver.resolve(task, COST)).output == COST_TEXT

        cheaper = edited(tmp_path, COST_TEXT, "Shipping is free above 40 and 4 below that.")
        after = await resolver.resolve(cheaper, COST)
        assert after.mode != "memory" and after.recall is not None
        assert "'shipping-cost', which the tree has changed since" in (after.recall.refused or "")


async def test_a_procedures_answer_is_served_until_its_steps_change(tmp_path: Path) -> None:
    task = support_task()
    script = Script(route=["account", "profile", "change email"], answers=[PROCEDURE_ANSWER])
    async with resolving(tmp_path, {EMAIL: script}) as (resolver, _):
        first = await resolver.resolve(task, EMAIL)
        assert (first.mode, first.output) == ("habit/procedure", PROCEDURE_ANSWER)
        await resolver.feedback(task, first.trace_id, correct=True)
        hit = await resolver.resolve(task, EMAIL)
        assert (hit.mode, hit.output) == ("memory", PROCEDURE_ANSWER)
        # A confirmed hit stands for what its entry stood for: the procedure, though its text is no tree text.
        await resolver.feedback(task, hit.trace_id, correct=True)
        stored = versions(resolver.store)
        assert stored[hit.trace_id] == stored[first.trace_id] == task.tree.option("change-email").answer_version

        relabelled = edited(tmp_path, "label: change email", "label: change the email")
        assert (await resolver.resolve(relabelled, EMAIL)).mode == "memory"
        stricter = edited(tmp_path, STEPS, STEPS + " Tell the old address too.")
        after = await resolver.resolve(stricter, EMAIL)
        assert after.mode == "habit/procedure" and after.recall is not None
        assert "'change-email', which the tree has changed since" in (after.recall.refused or "")
