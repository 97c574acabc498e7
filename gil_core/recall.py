"""Memory's part of one request: the lookup, then the checks that may take a hit back.

Memory is asked when the task sets a memory threshold (the verify band's lower edge when it has one), under the
task's memory-failure policy: a failed lookup is a miss that says why, or, with the "error" policy, a
``MemoryUnavailableError``. A hit may then be taken back, in this order: refused when its entry stands for an
answer the tree has changed or removed since (the next nearest entry at or above the threshold that stands for what
the tree gives now serves instead, if there is one; ``gil_core.answer_versions``), judged at memory's cut read from
the log instead of the configured one (with the learned judge on), refused by the hit guard, put to the yes/no
verification in the verify band unless its entry's evidence clears it, and overruled by the learned judge. A hit
that stands answers the request. See docs/architecture.md, "The way of one request".
"""

from __future__ import annotations

from dataclasses import replace

from gil_core.answer_versions import changed_answer
from gil_core.diagnostics import MemoryOutcome
from gil_core.errors import GilError, MemoryUnavailableError, ModelError
from gil_core.feedback import Feedback
from gil_core.learned import memory_configured, served_answer, unlike_at_root
from gil_core.memory import Memory, Recall
from gil_core.memory.evidence import MemoryEvidence
from gil_core.memory.guard import HitGuard, has_negation
from gil_core.tasks import TaskDefinition
from gil_core.wiring import Wiring

__all__ = ["MemoryStep"]

_GUARD = HitGuard()
_NEAREST = 8  # entries asked for when the nearest stands for an answer the tree has changed since
# A hit memory's lowered cut let through, for a request the learned judge finds unlike the confirmed ones.
_UNLIKE = "learned: the log's lower memory cut holds for requests like the confirmed ones, and this one is unlike them"


class MemoryStep:
    """What ``memory`` may answer for a request of a task, with the task's parts (``wiring``: the learned judges,
    the verifier, the answer index) and what verdicts taught (``feedback``: each entry's evidence)."""

    def __init__(self, memory: Memory | None, wiring: Wiring, feedback: Feedback) -> None:
        self._memory = memory
        self._parts = wiring
        self._feedback = feedback

    async def recall(self, task: TaskDefinition, text: str, *, private: bool) -> tuple[Recall | None, MemoryOutcome]:
        """The recall as the checks leave it (None: memory off, or nothing remembered), and what memory came to."""
        recall, outcome = await self._lookup(task, text)
        if recall is not None and recall.hit:
            recall = await self._still_the_trees(task, text, recall)
        if recall is not None and recall.similarity is not None and task.policy.learned is not None:
            recall = await self._at_learned_cut(task, recall)
        if recall is not None and task.policy.memory_guard:  # similar, but not the same request: a miss
            recall = _GUARD.screen(recall, text, private=private)
        if recall is not None and recall.hit and task.policy.memory_verify is not None:
            recall = await self._verified(task, text, recall)
        if recall is not None and recall.hit and task.policy.learned is not None:
            recall = await self._checked_by_learned(task, text, recall)
        if recall is not None and outcome != "failed":
            outcome = "hit" if recall.hit else "miss"
        return recall, outcome

    async def _lookup(self, task: TaskDefinition, text: str) -> tuple[Recall | None, MemoryOutcome]:
        threshold = task.policy.memory_threshold
        if task.policy.memory_verify is not None:
            threshold = task.policy.memory_verify  # the lowest similarity that may still be served
        if threshold is None or self._memory is None:
            return None, "off"
        try:
            recall = await self._memory.lookup(task.name, text, threshold=threshold)
        except Exception as exc:  # memory is a cache in front of the tree: a failure is a miss, traced
            if task.policy.memory_failure == "error":
                if isinstance(exc, MemoryUnavailableError):
                    raise
                raise MemoryUnavailableError(f"lookup failed: {exc}", task=task.name) from exc
            return Recall(threshold=threshold, hit=False, error=f"{type(exc).__name__}: {exc}"), "failed"
        return recall, "hit" if recall is not None and recall.hit else "miss"

    async def _still_the_trees(self, task: TaskDefinition, text: str, recall: Recall) -> Recall:
        """A hit whose entry stands for a tree answer the tree no longer gives (reworded, removed, a procedure's
        steps changed) does not serve: the nearest entry at or above the threshold that stands for what the tree
        gives now does (of the ``_NEAREST`` nearest), else the request is a miss that says why, and the walk
        answers in the tree's words. Entries are kept: under the tree they were confirmed for they serve again."""
        reason = self._changed(task, recall.answer, recall.source)
        if reason is None or self._memory is None:
            return recall
        try:
            nearest = await self._memory.nearest(task.name, text, _NEAREST)
        except (GilError, OSError):  # refused all the same: the walk answers
            return replace(recall, hit=False, refused=reason)
        for entry in nearest:
            if entry.similarity is None or entry.similarity < recall.threshold:
                break
            if self._changed(task, entry.answer, entry.key) is None:
                return Recall.from_nearest(entry, threshold=recall.threshold)
        return replace(recall, hit=False, refused=reason)

    def _changed(self, task: TaskDefinition, answer: str | None, key: str | None) -> str | None:
        """Why the entry ``key`` holding ``answer`` stands for an answer the task's tree no longer gives (None when
        it does not: the answer is one of the tree's now, "none of these", or stood for no tree answer)."""
        stripped = (answer or "").strip()
        if key is None or stripped == task.language.none_of_these:
            return None
        if self._parts.answers(task).option_for(stripped) is not None:
            return None
        try:
            version = self._feedback.stale_version(task, key)
        except GilError:  # the log could not be read: served as it was before versions were recorded
            return None
        return changed_answer(task.tree, version)

    async def _at_learned_cut(self, task: TaskDefinition, recall: Recall) -> Recall:
        """The recall judged at memory's cut read from the log (``learned.memory_cut``) instead of the configured
        one, once a fit has read it for the task's current memory settings."""
        configured = memory_configured(task)
        if configured is None:
            return recall
        try:
            state = await self._parts.learner(task).serving_state(task)
        except ModelError:
            return recall
        return recall if state.memory is None else state.memory.judged(recall, configured)

    async def _verified(self, task: TaskDefinition, text: str, recall: Recall) -> Recall:
        """A hit in the verify band, put to the yes/no judgment unless its entry's evidence clears it."""
        policy = task.policy
        assert policy.memory_threshold is not None and policy.memory_verify is not None
        evidence = self._feedback.memory_evidence(task) if recall.source is not None else MemoryEvidence()
        bar = evidence.threshold(recall.source, accept=policy.memory_threshold, verify=policy.memory_verify)
        if recall.similarity is None or recall.similarity >= bar or recall.text is None:
            return recall
        try:
            verdict = await self._parts.verifier(task).verify(text, recall.text)
        except ModelError as exc:  # an unverified hit is not served: a miss that says why
            return replace(recall, hit=False, verified=False, refused=f"verification failed: {exc}")
        same = verdict.yes and verdict.confidence >= policy.verify_confidence
        return replace(recall, hit=same, verified=same)

    async def _checked_by_learned(self, task: TaskDefinition, text: str, recall: Recall) -> Recall:
        """A memory hit the learned judge would overrule: where it would serve a whole walk to another answer
        than the remembered one (requests a word apart, "add milk to the list" and "check milk off the list",
        look alike to an embedder), the hit is a miss that says why and the walk answers. A hit below the task
        file's memory cut, let through by the cut the log proved, is a miss too where the learned judge finds
        the request unlike the confirmed ones at the root (its novelty cut, which keeps categories the tree does
        not hold out) and the remembered answer is one of the tree's: the log's precision was measured on
        requests like the confirmed ones ("none of these" stays: it is what such a request gets anyway). Costs
        no model call: the request's vector is the one memory just made."""
        learner = self._parts.learner(task)
        try:
            state = await learner.serving_state(task)
            vector = await learner.request_vector(text)
        except ModelError:
            return recall
        answer = (recall.answer or "").strip()
        configured = memory_configured(task)
        lowered = configured is not None and recall.similarity is not None and recall.similarity < configured
        if lowered and answer != task.language.none_of_these and unlike_at_root(state, task.tree, vector):
            # The log proved the lowered cut on requests like the confirmed ones; this one is unlike them.
            return replace(recall, hit=False, refused=_UNLIKE)
        served, option = served_answer(state, task.tree, vector, negates=has_negation(text))
        remembered = None if answer == task.language.none_of_these else self._parts.answers(task).option_for(answer)
        if not served or (remembered is None and answer != task.language.none_of_these) or option == remembered:
            return recall
        return replace(recall, hit=False, refused=f"learned: the learned judge serves {option or 'none of these'}")
