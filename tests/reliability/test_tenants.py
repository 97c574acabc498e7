"""Tenants on every table: tasks named to collide (``alpha``, ``Alpha``, ``alpha ``, a prefix ``alph``, a
wildcard ``alph%``) share one store, one memory folder and one runtime's request cache and operation log, each
confirming the same requests with answers of its own; then every read by task (store tables, stats, feedback
history, memory, the learned judge's state and refit, the cache, the operation log, habit counters, review
log and lists) must return that task's rows and answers only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl
import pytest
import yaml

from flows._prefect import artifact_key
from gil_core.batch import Ticket, resolve_batch, ticket_trace_id
from gil_core.client import JsonLinesOperationLog
from gil_core.errors import UnknownTraceError
from gil_core.habits.deactivation import read_reliability
from gil_core.habits.review_log import Decision, ReviewLog
from gil_core.learned import stored_state
from gil_core.learned.log import read_learned_log
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.memory import LanceDBMemory
from gil_core.memory._index import IndexSettings
from gil_core.resolver import Resolver
from gil_core.reviews import ReviewKind, promotion_review, review_file_name, safe_name
from gil_core.runtime import open_runtime
from gil_core.taskfile import load_task_file
from gil_core.tasks import LearnedPolicy, TaskDefinition
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.resolver._support import Script, SupportModel, support_task

pytestmark = pytest.mark.reliability

TEXTS = ("where is my refund?", "my parcel still has not come", "can i send this jacket back")


@dataclass(frozen=True)
class Tenant:
    """A task name and the answer it confirms for every one of ``TEXTS``: the route its model takes."""

    name: str
    route: tuple[str, ...]  # labels the judge picks, root to option
    category: str  # the root's child on that route
    option: str
    answer: str


TENANTS = (
    Tenant(
        "alpha",
        ("billing", "refund status"),
        "billing",
        "refund-status",
        "Refunds reach the original payment method within 5 business days of approval.",
    ),
    Tenant(
        "Alpha",
        ("shipping", "delivery time"),
        "shipping",
        "delivery-time",
        "Standard delivery takes 3 to 5 business days.",
    ),
    Tenant(
        "alpha ",
        ("returns", "return policy"),
        "returns",
        "return-policy",
        "Items can be returned within 30 days in their original condition.",
    ),
    Tenant(
        "alph",
        ("account", "security", "reset password"),
        "account",
        "reset-password",
        'Use "Forgot password" on the sign-in page; the link is valid for one hour.',
    ),
    Tenant(
        "alph%",
        ("billing", "payment methods"),
        "billing",
        "payment-methods",
        "We accept major credit cards, debit cards and bank transfer.",
    ),
)


@dataclass
class Seen:
    """What one tenant did: its traces (first passes, cache replays, memory hits) and the chat requests it cost."""

    first: dict[str, str] = field(default_factory=dict)  # text -> trace id of its first resolution
    traces: set[str] = field(default_factory=set)
    requests: int = 0


def chat_requests(server: ScriptedOpenAIServer) -> int:
    return sum(request.path.endswith("/chat/completions") for request in server.requests)


def tenant_task(tenant: Tenant) -> TaskDefinition:
    """The support task under the tenant's name, memory and the learned reflex on."""
    task = support_task(tenant.name, memory_threshold=0.5)
    return replace(task, policy=replace(task.policy, learned=LearnedPolicy(precision=0.95)))


def route_ids(task: TaskDefinition, tenant: Tenant) -> set[str]:
    """The ids of the nodes and the option on the tenant's route (the root included)."""
    return {node.id for node in task.tree.path_to(task.tree.owner(tenant.option).id)} | {tenant.option}


async def resolve_every_tenant(
    resolver: Resolver, server: ScriptedOpenAIServer, scripts: dict[str, Script]
) -> dict[str, Seen]:
    """Each tenant in turn: every text resolved (the model asked), resolved again (the request cache answers),
    confirmed, then resolved a third time (its memory answers). Every answer must be the tenant's own."""
    seen: dict[str, Seen] = {}
    for tenant in TENANTS:
        task, mine = tenant_task(tenant), Seen()
        scripts.clear()
        scripts.update({text: Script(route=list(tenant.route)) for text in TEXTS})
        before = chat_requests(server)
        for text in TEXTS:
            first = await resolver.resolve(task, text)
            asked = chat_requests(server)
            replay = await resolver.resolve(task, text)
            # Another tenant's cached judgment would have routed it elsewhere; its own is served from the cache.
            assert (first.mode, first.output) == ("habit/answer", tenant.answer), (tenant.name, first)
            assert (replay.mode, replay.output) == ("habit/answer", tenant.answer), (tenant.name, replay)
            assert chat_requests(server) == asked, f"{tenant.name!r}: a replay asked the model again"
            mine.first[text] = first.trace_id
            mine.traces |= {first.trace_id, replay.trace_id}
        mine.requests = chat_requests(server) - before
        assert mine.requests > 0, f"{tenant.name!r} got another tenant's cached judgments"
        for trace_id in mine.first.values():
            await resolver.feedback(task, trace_id, correct=True)
        for text in TEXTS:
            hit = await resolver.resolve(task, text)
            assert (hit.mode, hit.output) == ("memory", tenant.answer), (tenant.name, hit)
            assert hit.recall is not None and hit.recall.source == mine.first[text]
            mine.traces.add(hit.trace_id)
        seen[tenant.name] = mine
    return seen


async def test_tenants_sharing_a_store_memory_cache_and_log_read_back_only_their_own_rows(tmp_path: Path) -> None:
    """Five tasks named to collide, one runtime (request cache on, operation log under the store): no read of
    one task returns a row, an entry, an answer or a fitted example of another."""
    scripts: dict[str, Script] = {}
    with ScriptedOpenAIServer(responder=SupportModel(scripts)) as server:
        path = write_task_file(tmp_path, server.base_url, client={"log_path": str(tmp_path / "store")})
        async with open_runtime(load_task_file(path)) as runtime:
            resolver, memory = runtime.resolver, runtime.memory
            assert memory is not None and resolver.learner is not None
            seen = await resolve_every_tenant(resolver, server, scripts)
            learned = {tenant.name: await resolver.refresh_learned(tenant_task(tenant)) for tenant in TENANTS}
            recalled = {
                tenant.name: [await memory.lookup(tenant.name, text, threshold=0.5) for text in TEXTS]
                for tenant in TENANTS
            }
            held = {tenant.name: await memory.entries(tenant.name) for tenant in TENANTS}
            first_tenant = TENANTS[0]
            for other in TENANTS[1:]:  # a verdict on another tenant's trace: no such trace, for this task
                with pytest.raises(UnknownTraceError):
                    await resolver.feedback(tenant_task(other), seen[first_tenant.name].first[TEXTS[0]], correct=False)
        total_requests = chat_requests(server)

    fresh = TelemetryStore(tmp_path / "store")  # another process's view of the same store
    log = JsonLinesOperationLog(tmp_path / "store")
    review_log = ReviewLog(fresh)
    for tenant in TENANTS:
        review_log.record(tenant.name, ReviewKind.DEACTIVATION, tenant.option, Decision.REJECTED, f"by {tenant.name}")
    reviews = tmp_path / "reviews"
    for tenant in TENANTS:
        promotion_review(fresh, tenant_task(tenant)).write(
            reviews / review_file_name(tenant.name, ReviewKind.PROMOTION)
        )
    assert len(list(reviews.iterdir())) == len(TENANTS), "two tenants share a review list"
    every_trace = {trace for mine in seen.values() for trace in mine.traces}
    assert len(every_trace) == 9 * len(TENANTS)

    for tenant in TENANTS:
        name, mine, task = tenant.name, seen[tenant.name], tenant_task(tenant)
        mine_ids = route_ids(task, tenant)
        # -- the store's tables, read by task ------------------------------------------------------------------
        traces = fresh.read("traces").filter(pl.col("task") == name)
        assert set(traces["trace_id"]) == mine.traces, name
        assert set(traces["state"]) == set(TEXTS) and set(traces["output"]) == {tenant.answer}, name
        calls = fresh.read("calls").filter(pl.col("trace_id").is_in(list(mine.traces)))
        assert calls.filter(pl.col("role") == "judge").height == mine.requests, name  # its own calls, no other's
        vectors = fresh.read("vectors").filter(pl.col("task") == name)
        assert set(vectors["trace_id"]) <= mine.traces and vectors.height > 0, name
        assert fresh.read("run_configs").filter(pl.col("task") == name).height == 1, name
        choices = fresh.read("node_choices").filter(pl.col("scope") == name)
        assert set(choices["chosen_id"]) <= mine_ids and set(choices["node_id"]) <= mine_ids, name
        nodes = fresh.read("node_stats").filter(pl.col("scope") == name)
        assert set(nodes["node_id"]) <= mine_ids and nodes["hits"].sum() > 0, name
        # -- reads through the library ------------------------------------------------------------------------
        history = resolver.feedback_history(name)
        assert {event.trace_id for event in history} == set(mine.first.values()), name
        assert {event.output for event in history} == {tenant.answer}, name
        stats = fresh.stats(name, window=100)
        assert stats.requests == 9, name
        assert {mode.mode: (mode.requests, mode.judged) for mode in stats.modes} == {
            "habit/answer": (6, 3),
            "memory": (3, 0),
        }, name
        reliability = read_reliability(fresh, name)
        assert set(reliability) <= mine_ids and sum(c.reinforced for c in reliability.values()) > 0, name
        decisions = review_log.decisions(name)
        assert [(d.item_id, d.note) for d in decisions.values()] == [(tenant.option, f"by {name}")], name
        listed = yaml.safe_load((reviews / review_file_name(name, ReviewKind.PROMOTION)).read_text(encoding="utf-8"))
        assert listed["task"] == name, name
        # -- memory --------------------------------------------------------------------------------------------
        assert {(e.key, e.text, e.answer) for e in held[name]} == {
            (trace, text, tenant.answer) for text, trace in mine.first.items()
        }, name
        for recall in recalled[name]:
            assert recall is not None and recall.hit and recall.answer == tenant.answer, name
            assert recall.source in mine.first.values(), name
        # -- the learned judge: its state names the task, is fitted on its verdicts and holds its examples only --
        for state in (learned[name], stored_state(fresh, task)):
            assert state is not None and state.task == name and state.fitted_on["verdicts"] == len(TEXTS), name
            root = state.nodes[task.tree.root.id]
            assert {root.classes[i] for i in root.exemplar_class} == {tenant.category}, name
            assert len(root.exemplar_class) == len(TEXTS), name
        assert resolver.learner.embedder is not None
        learned_log = read_learned_log(
            fresh, name, task.tree, none_text=task.language.none_of_these, embedder=resolver.learner.embedder.name
        )
        assert {item.trace_id for item in learned_log.confirmed} == set(mine.first.values()), name
        assert {item.option for item in learned_log.confirmed} == {tenant.option}, name
        # -- the operation log ------------------------------------------------------------------------------
        entries = log.entries(name)
        assert len(entries) == mine.requests and {entry.task for entry in entries} == {name}, name
        assert log.stats(name).entries == mine.requests, name
        found = await log.recall(TEXTS[0], k=1000, task=name)
        assert found and {item.entry.task for item in found} == {name}, name
    assert len(log.entries()) == total_requests  # every call is in the log, and each carries its task
    assert {entry.task for entry in log.entries()} == {tenant.name for tenant in TENANTS}


HOSTILE_NAMES = ("alpha", "Alpha", "alpha ", "alph", "alph%", "alpha' OR '1'='1", "alpha\x00", "alpha\\", "_")


async def test_memory_answered_by_lancedb_filters_keeps_every_task_to_its_own_entries(tmp_path: Path) -> None:
    """With the index threshold at 2 entries, every task's lookups are LanceDB searches filtered by task (the
    path large tasks take): names that are prefixes, wildcards, quotes, NUL or backslashes of each other still
    find, forget and rebuild only their own entries, in a fresh instance too."""
    settings = IndexSettings(threshold=2, min_unindexed=1_000_000)
    memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel(), index=settings)
    for number, name in enumerate(HOSTILE_NAMES):
        for index, text in enumerate(TEXTS):
            await memory.remember(name, f"{number}-{index}", text, f"answer {number} to {index}")
    await memory.forget(HOSTILE_NAMES[0], "0-0")
    await memory.rebuild(HOSTILE_NAMES[1], [entry for entry in await memory.entries(HOSTILE_NAMES[1])][1:])

    def expected(number: int) -> set[str]:
        return {f"{number}-{index}" for index in range(len(TEXTS))} - ({f"{number}-0"} if number < 2 else set())

    for reader in (memory, LanceDBMemory(tmp_path / "memory", HashEmbeddingModel(), index=settings)):
        for number, name in enumerate(HOSTILE_NAMES):
            assert {entry.key for entry in await reader.entries(name)} == expected(number), repr(name)
            for index, text in enumerate(TEXTS):
                near = await reader.nearest(name, text, 50)
                assert {entry.key for entry in near} == expected(number), repr(name)
                recall = await reader.lookup(name, text, threshold=0.99)
                assert recall is not None and recall.source is not None and recall.source.startswith(f"{number}-")
                if f"{number}-{index}" in expected(number):
                    assert recall.answer == f"answer {number} to {index}", repr(name)


async def test_tickets_whose_ids_and_task_names_hold_the_separator_keep_a_trace_each(tmp_path: Path) -> None:
    """A ticket's trace id hashes its task and id joined by a separator (``\\x1f``): task ``a\\x1fb`` with ticket
    ``c`` and task ``a`` with ticket ``b\\x1fc`` used to share a trace id, the second batch's row superseding the
    first's (its trace gone from its task, its calls counted under the other). Each now keeps its own."""
    scripts = {text: Script(route=["billing", "refund status"]) for text in TEXTS}
    pairs: Sequence[tuple[str, str]] = (("a\x1fb", "c"), ("a", "b\x1fc"), ("a", "b"), ("a\x1fb\x1fc", ""))
    assert len({ticket_trace_id(task, ticket) for task, ticket in pairs}) == len(pairs)
    assert ticket_trace_id("support", "t1") == "90dc68c9eb7ad30be94c537cabe49579"  # plain pairs keep their id
    store = TelemetryStore(tmp_path / "store")
    with ScriptedOpenAIServer(responder=SupportModel(scripts)) as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, store)
            for task_name, ticket_id in pairs:
                await resolve_batch(resolver, support_task(task_name), [Ticket(ticket_id, TEXTS[0])])
    traces = TelemetryStore(tmp_path / "store").read("traces")
    assert traces.height == len(pairs)
    for task_name, ticket_id in pairs:
        rows = traces.filter(pl.col("task") == task_name)
        assert ticket_trace_id(task_name, ticket_id) in set(rows["trace_id"]), (task_name, ticket_id)


@pytest.mark.parametrize("name", ["alpha ", "a/b", "..", "alpha\x00", "x" * 80])
def test_a_task_named_like_another_tasks_escaped_name_gets_a_review_list_of_its_own(name: str) -> None:
    """``alpha `` is written as ``alpha-0bd0509bafa4``; a task named exactly that used to share its review list
    (and its Prefect artifact key). A plain name that looks escaped is escaped too."""
    escaped = safe_name(name)
    assert escaped != name
    for kind in ReviewKind:
        assert review_file_name(name, kind) != review_file_name(escaped, kind)
    assert artifact_key(name, "promotion") != artifact_key(escaped, "promotion")


def test_operation_log_lines_written_before_entries_carried_their_task_still_read(tmp_path: Path) -> None:
    """A line without ``task`` (as the log wrote them before) reads as an entry of no task: listed and counted
    in the whole log, never in any task's."""
    folder = tmp_path / "operation_log"
    folder.mkdir()
    old = {
        "entry_id": "old",
        "created_at": "2026-01-01T00:00:00.000000+00:00",
        "intent": None,
        "input_preview": "user: where is my refund?",
        "output": "A",
        "target_type": None,
        "success": True,
        "attempts": 1,
        "provider": "p",
        "model": "m",
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "duration_ms": 1.0,
        "tags": [],
        "error": None,
        "embedding": None,
    }
    new = {**old, "entry_id": "new", "task": "alpha"}
    (folder / "00000000000000000001-1-aaaa.jsonl").write_text(
        json.dumps(old) + "\n" + json.dumps(new) + "\n", encoding="utf-8"
    )
    log = JsonLinesOperationLog(tmp_path)
    assert [(entry.entry_id, entry.task) for entry in log.entries()] == [("old", None), ("new", "alpha")]
    assert [entry.entry_id for entry in log.entries("alpha")] == ["new"]
    assert log.entries("") == () and log.stats("alph").entries == 0 and log.stats().entries == 2
