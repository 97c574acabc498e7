"""Speed, part "resolver": what Gil itself costs per request through the tree and per batch, beside the bare model
call and embedding measured in the same run; three arms (durable per request, group commit, the learned judge
serving), each request's own cost and where it goes (cProfile). Run by ``benchmarks/speed.py --parts resolver``.
"""

from __future__ import annotations

import cProfile
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchmarks._learned_arm import support_stream, train_learned
from benchmarks._report import HotSpot, Row, Section, hot_spot_table, hot_spots, latency_text, percentile, support_tree
from gil_core.fallback import TreeAnswerContract
from gil_core.language import ENGLISH
from gil_core.llm import Message
from gil_core.memory import LanceDBMemory, MemoryEntry
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition, TaskPolicy
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedChatModel, ScriptedReply
from gil_core.traverse import Thresholds

__all__ = ["ResolverFigures", "ResolverSizes", "measure_resolver", "resolver_section"]


class ResolverSizes(Protocol):
    @property
    def requests(self) -> int: ...  # timed one by one

    @property
    def batch(self) -> int: ...  # resolved by resolve_batch

    @property
    def profiled(self) -> int: ...

    @property
    def remembered(self) -> int: ...  # entries in memory before the run


def _say(message: str) -> None:
    print(f"[speed] {message}", file=sys.stderr, flush=True)


def _first_label(messages: Sequence[Any], **_: Any) -> ScriptedReply:
    """A zero-latency model sure of the first candidate ("B"): every walk goes root → billing → a habit."""
    return ScriptedReply("B")


async def _time_each(count: int, run: Callable[[int], Awaitable[object]]) -> list[float]:
    walls = []
    for index in range(count):
        started = time.perf_counter()
        await run(index)
        walls.append(time.perf_counter() - started)
    return walls


# -- resolver overhead ----------------------------------------------------------------------------------------


@dataclass
class ResolverArm:
    """One way of committing a request's telemetry (durable before ``resolve`` returns, or group commit), or of
    judging (the learned judge serving, group commit)."""

    name: str
    tree_requests: list[float]  # each ``resolve`` call, one by one
    tree_seconds: float  # all of them, the flushes they caused included (and the last flush)
    memory_requests: list[float]
    batch_seconds: float
    batch_requests: int
    files_per_request: float  # Parquet files the tree requests wrote, per request
    batch_cpu_seconds: float = 0.0  # this process's CPU time (all threads) during the batch
    batch_loop_cpu_seconds: float = 0.0  # of which the event loop's thread (the requests; flushes run on the flusher's)
    model_calls: list[int] | None = None  # per tree request, when counted (else 2)
    embeddings: list[int] | None = None  # per tree request, when counted (else 1)
    model_call: list[float] | None = None  # the arm's own baselines, when its model and embedder differ
    embed_call: list[float] | None = None


@dataclass
class ResolverFigures:
    model_call: list[float]
    embed_call: list[float]
    arms: list[ResolverArm]  # durable per request, group commit, then the learned judge serving (group commit)
    profile: list[HotSpot]  # per request through the tree, group commit, flushes included
    remembered: int
    batch_size: int
    profiled: int
    learned_profile: list[HotSpot] = field(default_factory=list)
    learned_served: int = 0  # held-out requests the learned judge walks alone, timed in turn
    learned_held_out: int = 0
    learned_train_seconds: float = 0.0


# resolve_batch's defaults, which the group-commit arm uses throughout
_GROUP_ROWS, _GROUP_DELAY_S = 1000, 0.2


async def measure_resolver(sizes: ResolverSizes, root: Path) -> ResolverFigures:
    from gil_core.judge.prompt import Candidate, build_judge_messages, label_candidates
    from gil_core.ontology.labels import LabelScheme

    tree = support_tree()
    task = TaskDefinition(
        "bench",
        TreeAnswerContract(tree),
        tree,
        TaskPolicy(thresholds=Thresholds(per_layer=(0.5,), leaf=0.5), memory_threshold=0.95),
        ENGLISH,
    )
    chat, embedder = ScriptedChatModel(responder=_first_label), HashEmbeddingModel(384)
    memory = LanceDBMemory(root / "memory", embedder)
    remembered = [f"remembered request {i}: where is parcel {i}?" for i in range(sizes.remembered)]
    await memory.rebuild(
        task.name, [MemoryEntry(f"k{i}", text, "it is on its way") for i, text in enumerate(remembered)]
    )

    shown = label_candidates([Candidate.of(child) for child in tree.root.children], LabelScheme.LETTERS)
    messages = build_judge_messages(ENGLISH, "where is my parcel?", shown)
    model_call = await _time_each(
        sizes.requests, lambda i: chat.complete(messages, max_tokens=1, temperature=0.0, top_logprobs=5)
    )
    embed_call = await _time_each(sizes.requests, lambda i: embedder.embed([f"my order {i} has not arrived yet"]))

    arms = []
    for name, grouped in (("durable per request", False), ("group commit", True)):
        # Each arm its own store (a batch starts by reading which tickets have a trace: the other arm's files
        # would slow it down), the same memory.
        resolver = Resolver(chat, TelemetryStore(root / name.replace(" ", "-")), memory=memory)
        await resolver.resolve(task, "warm-up request")  # run config, shadow index, table handles
        arms.append(await _measure_arm(name, grouped, resolver, task, sizes, remembered))

    # No timed flushes here: cProfile sees this thread only, so every flush must run on it (at max_rows, or when
    # the block is left) to be counted.
    store = resolver.store  # the group-commit arm's
    profiler = cProfile.Profile()
    profiler.enable()
    with store.group_commit(max_rows=_GROUP_ROWS, max_delay_s=None):
        for index in range(sizes.profiled):
            await resolver.resolve(task, f"profiled request {index}: my order has not arrived")
    profiler.disable()
    figures = ResolverFigures(
        model_call,
        embed_call,
        arms,
        hot_spots(profiler, sizes.profiled, _HOT_SPOTS),
        sizes.remembered,
        sizes.batch,
        sizes.profiled,
    )
    await _measure_learned(figures, sizes, root / "learned")
    return figures


async def _measure_learned(figures: ResolverFigures, sizes: ResolverSizes, root: Path) -> None:
    """The learned judge serving (``benchmarks/_learned_arm.py``), group commit: held-out requests it walks alone,
    timed one by one and as a batch, with the model calls and embeddings each request made counted."""
    from gil_core.batch import Ticket, resolve_batch
    from gil_core.local import LocalModelMissingError

    try:
        setup = await train_learned(root)
    except (LocalModelMissingError, ImportError) as exc:  # MiniLM comes with the ``local`` extra
        _say(f"learned arm skipped: {exc}")
        return
    resolver, task, chat, embedder = setup.resolver, setup.task, setup.chat, setup.embedder
    figures.learned_served, figures.learned_held_out = len(setup.served), setup.held_out
    figures.learned_train_seconds = setup.train_seconds
    if not setup.served:
        _say("learned arm skipped: the learned judge walked none of the held-out requests alone")
        return
    served = setup.served
    probe: list[Message] = [{"role": "user", "content": served[0]}]
    model_call = await _time_each(sizes.requests, lambda i: chat.complete(probe, max_tokens=1, top_logprobs=20))
    embed_call = await _time_each(sizes.requests, lambda i: embedder.embed([served[i % len(served)]]))
    calls: list[int] = []
    embeddings: list[int] = []

    async def counted(index: int) -> None:
        asked, embedded = len(chat.history), embedder.calls
        await resolver.resolve(task, served[index % len(served)])
        calls.append(len(chat.history) - asked)
        embeddings.append(embedder.calls - embedded)

    store = resolver.store
    started = time.perf_counter()
    with store.group_commit(max_rows=_GROUP_ROWS, max_delay_s=_GROUP_DELAY_S):
        tree_requests = await _time_each(sizes.requests, counted)
    tree_seconds = time.perf_counter() - started
    tickets = [Ticket(f"learned-{i}", served[i % len(served)]) for i in range(sizes.batch)]
    started, cpu, loop_cpu = time.perf_counter(), time.process_time(), time.thread_time()
    report = await resolve_batch(resolver, task, tickets, concurrency=8, commit_rows=_GROUP_ROWS)
    batch_seconds, batch_cpu = time.perf_counter() - started, time.process_time() - cpu
    batch_loop_cpu = time.thread_time() - loop_cpu
    figures.arms.append(
        ResolverArm(
            "learned judge serving, group commit",
            tree_requests,
            tree_seconds,
            [],
            batch_seconds,
            report.resolved,
            0.0,
            batch_cpu,
            batch_loop_cpu,
            calls,
            embeddings,
            model_call,
            embed_call,
        )
    )
    profiler = cProfile.Profile()
    profiler.enable()
    with store.group_commit(max_rows=_GROUP_ROWS, max_delay_s=None):
        for index in range(sizes.profiled):
            await resolver.resolve(task, served[index % len(served)])
    profiler.disable()
    figures.learned_profile = hot_spots(profiler, sizes.profiled, _LEARNED_HOT_SPOTS)


async def _measure_arm(
    name: str, grouped: bool, resolver: Resolver, task: TaskDefinition, sizes: ResolverSizes, remembered: Sequence[str]
) -> ResolverArm:
    from gil_core.batch import Ticket, resolve_batch

    store = resolver.store

    def group() -> AbstractContextManager[object]:
        return store.group_commit(max_rows=_GROUP_ROWS, max_delay_s=_GROUP_DELAY_S) if grouped else nullcontext()

    def parquet_files() -> int:
        return sum(1 for _ in store.root.rglob("*.parquet"))

    files_before = parquet_files()
    started = time.perf_counter()
    with group():
        tree_requests = await _time_each(
            sizes.requests, lambda i: resolver.resolve(task, f"my order {i} has not arrived yet")
        )
    tree_seconds = time.perf_counter() - started
    files = (parquet_files() - files_before) / sizes.requests
    with group():
        memory_requests = await _time_each(
            sizes.requests, lambda i: resolver.resolve(task, remembered[i % len(remembered)])
        )
    tickets = [Ticket(f"{name}-{i}", f"batch request {i}: my parcel {i} is late") for i in range(sizes.batch)]
    started, cpu, loop_cpu = time.perf_counter(), time.process_time(), time.thread_time()
    report = await resolve_batch(resolver, task, tickets, concurrency=8, commit_rows=_GROUP_ROWS if grouped else None)
    batch_seconds, batch_cpu = time.perf_counter() - started, time.process_time() - cpu
    batch_loop_cpu = time.thread_time() - loop_cpu
    return ResolverArm(
        name,
        tree_requests,
        tree_seconds,
        memory_requests,
        batch_seconds,
        report.resolved,
        files,
        batch_cpu,
        batch_loop_cpu,
    )


# Functions worth naming in the profile: (file suffix, function name, label). Those missing in a run are left out.
_RESOLVE = "`Resolver.resolve` (all of it)"
_LOOKUP = "memory lookup (`LanceDBMemory.lookup`, hash embedding included)"
_RECORD = "`TelemetryStore.record_trace` (rows built, typed, queued)"
_WALK = "tree walk (2 judge calls through `CallRecorder`)"
_VERSION = "… memory: LanceDB table version check (at most every 0.5 s, and before each write)"
_WAITING = "… the event loop waiting (`epoll`: LanceDB's threads)"
_FLUSH = "group flushes, amortised (`GroupCommits.flush`)"
_RESOLVE_SPOT = ("gil_core/resolver.py", "resolve", _RESOLVE)
_RECORD_SPOT = ("gil_core/telemetry/store.py", "record_trace", _RECORD)
_FLUSH_SPOT = ("gil_core/telemetry/_group.py", "flush", _FLUSH)
_HOT_SPOTS = (
    _RESOLVE_SPOT,
    ("gil_core/recall.py", "_lookup", _LOOKUP),
    ("gil_core/memory/lancedb_memory.py", "_sync", _VERSION),
    ("~", "<method 'poll' of 'select.epoll' objects>", _WAITING),
    ("gil_core/resolver.py", "_walk", _WALK),
    _RECORD_SPOT,
    ("gil_core/telemetry/_rows.py", "conformable", "… `conformable`: the cheap type check before queueing"),
    _FLUSH_SPOT,
    ("gil_core/telemetry/_group.py", "prepare", "… `prepare`: each table conformed and validated once per group"),
    ("gil_core/telemetry/schemas.py", "validate_frame", "… … `validate_frame`: schema checks"),
    ("gil_core/storage.py", "write_parquet", "… the store folder's `write_parquet`: Parquet + fsync + rename"),
    ("~", "<built-in method posix.fsync>", "… … `os.fsync` (file and folder)"),
)

_LEARNED_LOOKUP = "memory lookup (`LanceDBMemory.lookup`, the request's one embedding)"
_LEARNED_WALK = "tree walk (learned judge, no model call)"
_LEARNED_HOT_SPOTS = (
    _RESOLVE_SPOT,
    ("gil_core/recall.py", "_lookup", _LEARNED_LOOKUP),
    ("gil_core/resolver.py", "_walk", _LEARNED_WALK),
    ("gil_core/learned/judge.py", "judge", "learned judgments (`LearnedJudge.judge`, every node of the walk)"),
    ("gil_core/learned/state.py", "predict", "… `NodeModel.predict`: classifier and novelty check (numpy)"),
    ("gil_core/learned/learner.py", "serving_state", "`Learner.serving_state` (the state in use, checked)"),
    _RECORD_SPOT,
    _FLUSH_SPOT,
)


def _baselines(figures: ResolverFigures, arm: ResolverArm) -> tuple[float, float]:
    """The p50 of a bare model call and of one embedding, for ``arm`` (its own where its model differs)."""
    model = percentile(arm.model_call if arm.model_call else figures.model_call, 0.5)
    return model, percentile(arm.embed_call if arm.embed_call else figures.embed_call, 0.5)


def _own_costs(figures: ResolverFigures, arm: ResolverArm) -> list[float]:
    """Each tree request's wall time less what the model and embedder themselves took for it: the calls it made
    (2 judge calls and 1 embedding in the telemetry arms; counted per request in the learned arm) at their p50."""
    model, embed = _baselines(figures, arm)
    count = len(arm.tree_requests)
    calls = arm.model_calls if arm.model_calls is not None else [2] * count
    embeddings = arm.embeddings if arm.embeddings is not None else [1] * count
    return [
        wall - made * model - embedded * embed
        for wall, made, embedded in zip(arm.tree_requests, calls, embeddings, strict=True)
    ]


def _overhead(figures: ResolverFigures, arm: ResolverArm) -> float:
    """A request's own cost, p50: wall time less what the zero-latency model and embedder themselves take."""
    return percentile(_own_costs(figures, arm), 0.5)


def _walk_text(arm: ResolverArm) -> str:
    if arm.model_calls is None:
        return "memory miss, 2 judge calls, habit answer"
    calls = sum(arm.model_calls) / len(arm.model_calls)
    return f"memory miss, every node served by the learned judge, {calls:.2f} model calls per request (audits)"


def _made_text(arm: ResolverArm) -> str:
    if arm.model_calls is None:
        return "2 model calls − 1 embedding"
    return "the model calls and embeddings it made"


def _batch_text(arm: ResolverArm) -> str:
    rate = arm.batch_requests / arm.batch_seconds
    text = f"{rate:,.0f} requests/s"
    if arm.batch_cpu_seconds > 0:
        cpu = arm.batch_cpu_seconds / arm.batch_requests
        loop = arm.batch_loop_cpu_seconds / arm.batch_requests
        text += f" ({cpu * 1000:.2f} ms of this process's CPU per request, all threads; {loop * 1000:.2f} ms "
        text += "on the event loop's)"
    return text


def resolver_section(figures: ResolverFigures, command: str) -> Section:
    rows = [
        Row("baseline: bare scripted model call (`ScriptedChatModel.complete`)", "—", latency_text(figures.model_call)),
        Row("baseline: hash embedding of one request (384 dims)", "—", latency_text(figures.embed_call)),
    ]
    learned = [arm for arm in figures.arms if arm.model_call]
    for arm in learned:
        assert arm.model_call is not None and arm.embed_call is not None
        rows += [
            Row(f"baseline ({arm.name}): bare call of its model", "—", latency_text(arm.model_call)),
            Row(
                f"baseline ({arm.name}): one embedding (MiniLM vectors computed before the run, served from a dict)",
                "—",
                latency_text(arm.embed_call),
            ),
        ]
    for arm in figures.arms:
        mean = arm.tree_seconds / len(arm.tree_requests)
        files = f"; {arm.files_per_request:.2f} Parquet files per request" if arm.files_per_request else ""
        rows.append(
            Row(
                f"{arm.name}: request through the tree ({_walk_text(arm)})",
                "—",
                f"{latency_text(arm.tree_requests)}; mean with every flush {mean * 1000:.2f} ms{files}",
            )
        )
        if arm.memory_requests:
            rows.append(Row(f"{arm.name}: request answered from memory", "—", latency_text(arm.memory_requests)))
    for arm in figures.arms:
        overhead = _overhead(figures, arm)
        mean = sum(_own_costs(figures, arm)) / len(arm.tree_requests)
        mean += (arm.tree_seconds - sum(arm.tree_requests)) / len(arm.tree_requests)  # the flushes after the last
        rows.append(
            Row(
                f"{arm.name}: resolver overhead per request, p50 (tree request − {_made_text(arm)})",
                "≤ 1 ms",
                f"{overhead * 1000:.2f} ms (mean with every flush: {mean * 1000:.2f} ms)",
                overhead <= 0.001,
            )
        )
    for arm in figures.arms:
        rate = arm.batch_requests / arm.batch_seconds
        rows.append(
            Row(
                f"{arm.name}: batch, `resolve_batch`, concurrency 8, {arm.batch_requests:,} requests",
                "≥ 1,000 requests/s",
                _batch_text(arm),
                rate >= 1000,
            )
        )
    tables = [
        hot_spot_table(
            "where (cProfile, per request through the tree, group commit, the block's flush included)",
            figures.profile,
        )
    ]
    if figures.learned_profile:
        tables.append(
            hot_spot_table(
                "where, learned judge serving (cProfile, per request, group commit, the block's flush included)",
                figures.learned_profile,
            )
        )
    lead = (
        "One `Resolver` over the support tree with a zero-latency in-process model (`ScriptedChatModel` sure of its "
        "first candidate, so every walk is root → billing → an answer habit), memory on (`LanceDBMemory` with "
        f"`HashEmbeddingModel(384)`, holding {figures.remembered:,} entries) and telemetry on "
        "(`TelemetryStore` in a temporary folder). Two arms, each with its own store: **durable per "
        "request** (a request's calls, trace and walk counters written as one `append_many`, one file per table, "
        "each fsync-ed, before `resolve` returns) and **group commit** (inside `store.group_commit(max_rows="
        f"{_GROUP_ROWS}, max_delay_s={_GROUP_DELAY_S})`, the defaults `resolve_batch` uses: `resolve` returns once "
        "its rows are queued; a flush writes one file per table per group). Requests are timed one by one after a "
        "warm-up; the mean adds every flush the requests caused, and the last one. Each batch runs "
        f"`gil_core.batch.resolve_batch` over {figures.batch_size:,} new tickets (with `commit_rows=None` in the "
        "durable arm); in the group arm a ticket counts only once its trace is flushed."
    )
    if learned:
        lead += (
            " A third arm, **learned judge serving** (group commit), has its own resolver, store and memory, trained "
            "as tests/learned train one (`benchmarks/_learned_arm.py`): the support task with `learned_reflex` "
            '(precision 0.95, audits at the default 5%), a zero-latency model that judges badly ("none of these" '
            "at every node), and the verdicts of the answer key on the first "
            f"{len(support_stream()) - figures.learned_held_out} support requests, fed back 40 at a time "
            f"({figures.learned_train_seconds:.0f} s). Of the {figures.learned_held_out} held-out requests, the "
            f"learned judge walked {figures.learned_served} alone (a memory miss, no model call: found by resolving "
            "each once before timing); those are the arm's requests, in turn. Memory and the learned judge share "
            "one embedding per request (`TraceVectorCache`); each request's model calls and embeddings are "
            "counted, and its own cost is its time less those at their baselines' p50, measured in the same run."
        )
    return Section(
        "Speed: resolver overhead (part B)",
        command,
        lead,
        rows,
        _resolver_notes(figures),
        extra_tables=tables,
    )


def _where(profile: Sequence[HotSpot], profiled: int, labels: Sequence[str]) -> str:
    """Where a request's time went, from its profile (the shares of ``labels`` and of the flushes)."""
    spots = {label: cumulative for label, _, cumulative, _ in profile}
    flushes = spots.get(_FLUSH, 0.0)
    total = spots.get(_RESOLVE, 0.0) + flushes  # the flushes here ran when the profiled block was left
    if total <= 0:
        return ""
    parts = [(label, spots[label]) for label in labels if label in spots] + [(_FLUSH, flushes)]
    shares = "; ".join(f"{label.split(' (')[0].strip('`')} {ms:.2f} ms ({ms / total:.0%})" for label, ms in parts)
    return (
        f"Per request (cProfile, which slows Python down; flushes amortised over the {profiled:,} profiled "
        f"requests): {total:.2f} ms, of which {shares}."
    )


def _resolver_notes(figures: ResolverFigures) -> list[str]:
    durable, grouped = figures.arms[:2]
    notes = []
    speedup = percentile(durable.tree_requests, 0.5) / percentile(grouped.tree_requests, 0.5)
    batch_speedup = (grouped.batch_requests / grouped.batch_seconds) / (durable.batch_requests / durable.batch_seconds)
    notes.append(
        f"Group commit against a durable write per request, same run: a request through the tree is "
        f"{speedup:.1f}× faster at p50 ({durable.files_per_request:.1f} → {grouped.files_per_request:.2f} Parquet "
        f"files per request), a batch {batch_speedup:.1f}× faster. What a request gives up: it is acknowledged "
        f"when its group is flushed (within {_GROUP_DELAY_S} s, or at {_GROUP_ROWS:,} queued rows), not when "
        "`resolve` returns; a crash loses the requests not flushed yet, which a batch rerun resolves again."
    )
    grouped_arms = figures.arms[1:]
    overhead_met = all(_overhead(figures, arm) <= 0.001 for arm in grouped_arms)
    slow = [arm for arm in grouped_arms if arm.batch_requests / arm.batch_seconds < 1000]
    if overhead_met and not slow:
        return notes
    where = _where(figures.profile, figures.profiled, (_LOOKUP, _WALK, _RECORD))
    if not overhead_met:
        notes.append(f"**Miss** (resolver overhead, group commit), cause: our code. {where}")
    for arm in slow:
        wall = arm.batch_seconds / arm.batch_requests
        cpu = arm.batch_cpu_seconds / arm.batch_requests
        loop = arm.batch_loop_cpu_seconds / arm.batch_requests
        if arm.model_call:  # the learned arm: its own profile
            where = _where(figures.learned_profile, figures.profiled, (_LEARNED_LOOKUP, _LEARNED_WALK, _RECORD))
        cause = (
            "the share of 2 cores the machine's other load leaves this process"
            if cpu * 1000 <= 1.0
            else "CPU: our code's, and the share of 2 cores the machine's other load leaves this process"
        )
        notes.append(
            f"**Miss** ({arm.name}, batch), cause: {cause}. A request of the batch took {wall * 1000:.2f} ms of "
            f"wall time and {cpu * 1000:.2f} ms of this process's CPU (all threads: the event loop, the group's "
            f"flusher thread, Polars and LanceDB; {loop * 1000:.2f} ms of it on the event loop's thread, which "
            f"resolves the requests): on a core of its own the batch would reach about {1 / cpu:,.0f} requests/s. "
            f"{where} The flushes are `gil_core/telemetry` (each group's rows conformed, validated, written as one "
            "Parquet file per table and fsync-ed): they run on the group's flusher thread, woken when a group "
            f"reaches {_GROUP_ROWS:,} rows; the event loop's thread writes a group only when the flusher is four "
            "groups behind or its last flush failed. The profile above runs without the timer, so without the "
            "thread: its flushes ran on the profiled thread, where they are counted."
        )
    return notes
