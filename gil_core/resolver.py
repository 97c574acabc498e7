"""The resolver: memory, then the tree, then the habit's output, then narrowed and finally full generation.

Every request ends in exactly one stored trace with its priced calls. Memory's part (the lookup and the checks
that may take a hit back) is ``gil_core.recall``; the parts a request is served with are wired per task in
``gil_core.wiring``; feedback on a trace, and what it teaches memory, the habit statistics and the learned
judge, is ``gil_core.feedback``. See docs/architecture.md, "The way of one request".
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from gil_core._redaction import unquote
from gil_core._ticket_files import Verdict
from gil_core.batch_scope import batch_columns
from gil_core.diagnostics import MemoryOutcome
from gil_core.errors import MemoryUnavailableError, ModelError
from gil_core.fallback import Generation, TreeAnswerContract, run_procedure
from gil_core.fallback.contracts import Contract
from gil_core.feedback import Feedback, GivenVerdicts
from gil_core.habits.attribution import ReliabilityDelta
from gil_core.habits.counters import walk_rows
from gil_core.learned import LearnedJudge, LearnedState, Learner
from gil_core.llm import ChatModel, EmbeddingModel, trace_scope
from gil_core.llm.options import call_options
from gil_core.memory import FeedbackEvent, Memory, Recall
from gil_core.ontology.model import Option, OptionKind
from gil_core.recall import MemoryStep
from gil_core.tasks import Resolution, TaskDefinition
from gil_core.telemetry import CallRecord, TelemetryStore, TraceRecord, utc_now
from gil_core.traverse import GreedyTraverser, Step, Traversal
from gil_core.wiring import ClientSetup, Judging, Metering, Wiring

__all__ = ["ClientSetup", "Judging", "Metering", "Resolver"]


@dataclass
class _Outcome:
    """What one request came to, before it is stored."""

    mode: str
    output: str | None = None
    confidence: float | None = None
    walk: Traversal | None = None
    recall: Recall | None = None
    memory: MemoryOutcome = "off"
    failure: str | None = None
    habit: str | None = None
    explored_output: str | None = None
    deltas: list[ReliabilityDelta] = field(default_factory=list)


class Resolver:
    """Resolves requests for any number of tasks over one store, one chat model and (optionally) one memory.

    ``chat`` is wrapped in a ``CallRecorder`` so every call is priced (``metering``) and stored with its trace;
    ``client`` says how calls reach it (client stack, fallback model, extra request fields), ``judging`` what
    judges instead of it (a judge, a verifier) and how (the order seed). ``reflex_embedder`` embeds requests for
    the description reflex and the learned judge (``learned_reflex``); giving memory the same
    ``TraceVectorCache`` makes one embedding serve memory, the judges and the vector stored with the trace.
    """

    def __init__(
        self,
        chat: ChatModel,
        store: TelemetryStore,
        *,
        memory: Memory | None = None,
        reflex_embedder: EmbeddingModel | None = None,
        client: ClientSetup | None = None,
        judging: Judging | None = None,
        metering: Metering | None = None,
    ) -> None:
        self._store = store
        self._parts = Wiring(chat, store, reflex_embedder, client=client, judging=judging, metering=metering)
        self._learner, self._diagnostics = self._parts.learners, self._parts.diagnostics
        self._feedback = Feedback(store, memory=memory, learner=self._learner, answers=self._parts.answers)
        self._memory = MemoryStep(memory, self._parts, self._feedback)
        self._configs: dict[str, dict[str, Any]] = {}
        self._configured: dict[str, TaskDefinition] = {}  # the definition whose configuration was recorded last

    @property
    def store(self) -> TelemetryStore:
        return self._store

    @property
    def learner(self) -> Learner | None:
        """The learned judges of this resolver's tasks (None without an embedder)."""
        return self._learner

    # -- resolve ------------------------------------------------------------------------------------------

    async def resolve(
        self, task: TaskDefinition, text: str, *, trace_id: str | None = None, do_not_record: bool = False
    ) -> Resolution:
        """Resolve one request. Its trace, calls and walk counters are stored as one unit: durable when this
        returns, or, inside the store's ``group_commit``, once the group flushes.

        ``do_not_record`` (or the task's policy) keeps the request's text out of every table, log and cache: the
        trace keeps mode, path, confidence, energy and failure, not the request or output; calls keep counts and
        price, not content; feedback on it teaches habit statistics, never memory (see README, ``do_not_record``).
        """
        trace_id = trace_id or uuid.uuid4().hex
        private = do_not_record or task.policy.do_not_record
        self._record_config(task)
        calls: list[CallRecord] = []
        failed: MemoryUnavailableError | None = None
        with (
            self._diagnostics.resolve_span(task.name, private=private) as span,
            trace_scope(trace_id, collect=calls),
            call_options(do_not_record=True) if private else nullcontext(),
        ):
            try:
                outcome = await self._resolve(task, text, trace_id, private=private)
            except MemoryUnavailableError as exc:  # only with the "error" memory-failure policy
                failed = _unquoted_error(exc, text) if private else exc
                outcome = _Outcome("abstain", memory="failed", failure=f"memory failed: {failed}")
            if private:
                _unquote(outcome, text)
            energy = sum(call.energy for call in calls)
            span.finish(
                mode=outcome.mode,
                memory=outcome.memory,
                energy=energy,
                confidence=outcome.confidence,
                failure=outcome.failure,
            )
        steps = outcome.walk.steps if outcome.walk is not None else ()
        trace = TraceRecord(
            trace_id=trace_id,
            created_at=utc_now(),
            task=task.name,
            state="" if private else text,
            mode=outcome.mode,
            path=[step.to_json() for step in steps],
            output=None if private else outcome.output,
            confidence=outcome.confidence,
            energy=energy,
            explored_output=None if private else outcome.explored_output,
            label=outcome.habit,
            recall=outcome.recall.to_json() if outcome.recall is not None else None,
            failure=outcome.failure,
            extra={"decider": _decider(outcome.mode, steps), **batch_columns()},
        )
        counters = walk_rows(task.name, steps, outcome.deltas, trace.created_at)
        if task.policy.learned is not None and not private and self._learner is not None:
            vector = self._learner.vector_row(task.name, trace_id, text)
            if vector is not None:  # the request's vector, for the learned judge's refits
                counters["vectors"] = [vector]
        self._feedback.keep(self._store.record_trace(trace, calls, extra_rows=counters))
        if failed is not None:
            raise failed
        return Resolution(
            trace_id=trace_id,
            task=task.name,
            mode=outcome.mode,
            output=outcome.output,
            confidence=outcome.confidence,
            path=tuple(steps),
            energy=energy,
            recall=outcome.recall,
            failure=outcome.failure,
            habit=outcome.habit,
            explored_output=outcome.explored_output,
        )

    async def _resolve(self, task: TaskDefinition, text: str, trace_id: str, *, private: bool) -> _Outcome:
        recall, memory_outcome = await self._memory.recall(task, text, private=private)
        if recall is not None and recall.hit:
            return _Outcome("memory", recall.answer, recall.similarity, recall=recall, memory="hit")
        walk, failure = await self._walk(task, text)
        outcome = await self._answer(task, text, walk, trace_id)
        outcome.recall, outcome.memory = recall, memory_outcome
        if failure is not None and outcome.failure is None and outcome.output is None:
            outcome.failure = failure
        return outcome

    async def _walk(self, task: TaskDefinition, text: str) -> tuple[Traversal | None, str | None]:
        root = task.tree.root
        if not task.policy.use_tree or (not root.children and not root.options):
            return None, None  # the baseline, or a bare root: straight to generation, no judgment call
        shadows = self._feedback.shadows(task) if task.policy.show_shadows else None
        try:
            judge = await self._parts.judge(task)
        except ModelError as exc:  # the embedder failed while the learned judge was being fitted
            return None, f"learned judge failed: {exc}"
        traverser = GreedyTraverser(judge, task.policy.thresholds)
        try:
            walk = await traverser.traverse(text, task.tree, shadows=shadows)
        except ModelError as exc:
            return None, f"judge failed: {exc}"
        if isinstance(judge, LearnedJudge):
            walk = await judge.look_ahead(text, walk, task.tree)
        return walk, None

    async def _answer(self, task: TaskDefinition, text: str, walk: Traversal | None, trace_id: str) -> _Outcome:
        if _learned_none(task, walk):
            # People confirmed "none of these" for requests like this one: that is the answer, no generation.
            assert walk is not None
            return _Outcome("none", task.language.none_of_these, walk.steps[0].p, walk)
        habit = walk.habit if walk is not None else None
        if habit is None:
            return await self._generate(task, text, walk, trace_id)
        confidence = walk.steps[-1].p if walk is not None else None
        outcome: _Outcome | None = None
        if habit.kind is OptionKind.ANSWER:
            outcome = _Outcome("habit/answer", habit.text, confidence, walk, habit=habit.id)
        elif habit.kind is OptionKind.TEMPLATE:
            filler = self._parts.slot_filler(task)
            filled = await self._guard(filler.fill(text, habit, node_id=task.tree.owner(habit.id).id))
            if isinstance(filled, str) or filled.output is None:
                # The template could not be filled: answer within the categories above it.
                return await self._generate(task, text, walk, trace_id)
            outcome = _Outcome("habit/template", filled.output, confidence, walk, habit=habit.id)
        else:
            generation = await self._guard(
                run_procedure(
                    self._parts.generator(task),
                    text,
                    habit,
                    path=_path_labels(task, walk),
                    node_id=task.tree.owner(habit.id).id,
                )
            )
            output, failure = _generated(generation)
            outcome = _Outcome("habit/procedure", output, confidence, walk, habit=habit.id, failure=failure)
        if _explores(trace_id, task.policy.exploration_rate):
            await self._explore(task, text, habit, outcome)
        return outcome

    async def _generate(self, task: TaskDefinition, text: str, walk: Traversal | None, trace_id: str) -> _Outcome:
        """Generation under the task's contract, narrowed to the deepest confirmed category (habits and
        shadows are not categories, so a template that could not be filled answers within its own); not asked
        where the learned judge's log shows it does not help (``learned.generation_floor``)."""
        categories = _categories(task, walk)
        mode = "partial" if categories else "fallback"
        if not task.policy.allow_fallback:
            reason = walk.exit_reason if walk is not None else "no tree"
            return _Outcome("abstain", walk=walk, failure=f"no habit reached ({reason}) and fallback is off")
        skipped = self._learner.skips_generation(task, trace_id) if self._learner is not None else None
        if skipped is not None:
            return _Outcome("abstain", walk=walk, failure=f"not generated: {skipped}")
        contract: Contract = task.contract
        path = _path_labels(task, walk)
        if path and isinstance(contract, TreeAnswerContract):
            narrowed = contract.narrowed(categories[-1])
            # A category with no answers of its own cannot narrow anything: keep the full list.
            contract = narrowed if narrowed.answers() else contract
        node_id = walk.last_node if walk is not None else task.tree.root.id
        generation = await self._guard(
            self._parts.generator(task).generate(text, contract, path=path, examples=task.examples, node_id=node_id)
        )
        output, failure = _generated(generation)
        return _Outcome(mode, output, None, walk, failure=failure)

    async def _explore(self, task: TaskDefinition, text: str, habit: Option, outcome: _Outcome) -> None:
        """Cross-check a habit answer against full generation; a different answer is a dispute."""
        generation = await self._guard(
            self._parts.generator(task).generate(text, task.contract, examples=task.examples)
        )
        explored, _ = _generated(generation)
        outcome.explored_output = explored
        disputed = int(explored is not None and outcome.output is not None and explored != outcome.output.strip())
        outcome.deltas.append(ReliabilityDelta(habit.id, explored=1, disputed=disputed))

    async def _guard(self, work: Any) -> Any:
        """Await model work; a model failure becomes a failure text instead of an exception."""
        try:
            return await work
        except ModelError as exc:
            return f"model failed: {exc}"

    # -- feedback: gil_core.feedback ----------------------------------------------------------------------

    async def feedback(self, task: TaskDefinition, trace_id: str, correct: bool, correction: str | None = None) -> bool:
        """Record a verdict on a trace, then teach habit statistics and memory from it (``Feedback.give``); False
        when memory failed to learn it (the verdict is stored all the same)."""
        return await self._feedback.give(task, trace_id, correct, correction)

    async def feedback_many(
        self, task: TaskDefinition, verdicts: Sequence[Verdict], *, skip_carried: bool = False
    ) -> GivenVerdicts:
        """Record verdicts in order, stored in one append and taught in one write (``Feedback.give_many``)."""
        return await self._feedback.give_many(task, verdicts, skip_carried=skip_carried)

    async def refresh_learned(self, task: TaskDefinition, *, force: bool = False) -> LearnedState | None:
        """Bring the task's learned judge up to the log (``Feedback.refresh_learned``)."""
        return await self._feedback.refresh_learned(task, force=force)

    def feedback_history(self, task: str) -> list[FeedbackEvent]:
        """Every verdict the store holds for ``task``, in the order they were given (``Feedback.history``)."""
        return self._feedback.history(task)

    async def rebuild_memory(self, task: TaskDefinition) -> int:
        """Make the task's memory hold what its feedback confirms; its entries after (``Feedback.rebuild_memory``)."""
        return await self._feedback.rebuild_memory(task)

    # -- helpers ------------------------------------------------------------------------------------------

    def _record_config(self, task: TaskDefinition) -> None:
        if self._configured.get(task.name) is task:  # a definition is immutable: its configuration is recorded
            return
        config = task.config()
        if self._configs.get(task.name) != config:
            self._store.append(
                "run_configs",
                [{"task": task.name, "created_at": utc_now(), "config": json.dumps(config, ensure_ascii=False)}],
            )
            self._configs[task.name] = config
        self._configured[task.name] = task


def _unquote(outcome: _Outcome, text: str) -> None:
    """Take the request's words out of a do-not-record request's failure and memory's error and refusal (all are
    stored)."""
    if outcome.failure is not None:
        outcome.failure = unquote(outcome.failure, text)
    recall = outcome.recall
    if recall is not None and (recall.error is not None or recall.refused is not None):
        outcome.recall = replace(
            recall,
            error=None if recall.error is None else unquote(recall.error, text),
            refused=None if recall.refused is None else unquote(recall.refused, text),
        )


def _unquoted_error(error: MemoryUnavailableError, text: str) -> MemoryUnavailableError:
    """The memory failure a do-not-record request raises: its message unquoted, and no cause attached (a
    traceback prints the cause's message, which may quote the request)."""
    return MemoryUnavailableError(unquote(error.reason, text), task=error.task, open_until=error.open_until)


def _generated(generation: Generation | str) -> tuple[str | None, str | None]:
    """The output of a generation and, when there is none, why."""
    if isinstance(generation, str):
        return None, generation
    if generation.output is None:
        tries = f"{generation.attempts} attempt{'' if generation.attempts == 1 else 's'}"
        return None, f"contract violated after {tries}: {generation.complaint}"
    return generation.output, None


_GENERATED = frozenset({"fallback", "partial", "habit/procedure"})


def _decider(mode: str, steps: Sequence[Step]) -> str:
    """Who settled the request (``schemas.DECIDERS``): the most expensive decider it used."""
    if mode == "memory":
        return "memory"
    if mode in _GENERATED:
        return "generation"
    judged = [step.decided_by for step in steps if step.outcome != "skip"]
    if any(_asked_llm(step) for step in steps if step.outcome != "skip"):
        return "llm"  # "llm", "deliberate" (a tiered judge's LLM), None (the LLM judge alone), a guess after it
    if "reflex" in judged:
        return "reflex"
    if judged:
        return "learned" if mode != "abstain" else "abstain"
    return "abstain"


def _asked_llm(step: Step) -> bool:
    """Whether the LLM judged this step: not a learned or reflex step, not one whose next judge was not asked
    ("unasked"), nor a guess made without asking it (a guess keeps the LLM's judgment as its audit)."""
    if step.decided_by in ("learned", "reflex", "unasked"):
        return False
    return step.decided_by != "guess" or step.audit is not None


def _categories(task: TaskDefinition, walk: Traversal | None) -> list[str]:
    """The categories (nodes, not habits or shadows) confirmed on the way down, in order."""
    if walk is None:
        return []
    return [node_id for node_id in walk.confirmed if task.tree.has_node(node_id)]


def _path_labels(task: TaskDefinition, walk: Traversal | None) -> list[str]:
    """The confirmed categories' labels, where the task narrows generation to its path."""
    if task.policy.fallback_scope != "path":
        return []
    return [task.tree.node(node_id).label for node_id in _categories(task, walk)]


def _learned_none(task: TaskDefinition, walk: Traversal | None) -> bool:
    """Whether the learned judge served "none of these" at the root of a tree-answer task."""
    if walk is None or walk.exit_reason != "none_selected" or len(walk.steps) != 1:
        return False
    return walk.steps[0].decided_by == "learned" and isinstance(task.contract, TreeAnswerContract)


def _explores(trace_id: str, rate: float) -> bool:
    """Whether this trace is one of the ``rate`` share cross-checked: stable per trace id, no RNG state."""
    if rate <= 0.0:
        return False
    draw = int(hashlib.sha256(trace_id.encode("utf-8")).hexdigest()[:8], 16) / 0x1_0000_0000
    return draw < rate
