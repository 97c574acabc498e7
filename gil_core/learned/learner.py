"""Keeping each task's learned judge current: fitted from the log, stored in the task's store, refit after
feedback, picked up when another process refit it.

* **Where.** ``<store>/learned/<task key>/`` (a side folder of the task's ``TelemetryStore``, so a local folder
  or an ``s3://`` prefix), one Parquet file per fit, named ``<tree+embedder key>.<time>-<random>.parquet``: the
  newest file of the current tree and embedder is the state. The task key is a hash of the task name, so no name
  becomes a path, and a state names its task, so a file is never read for another task.
* **When.** Feedback (``note_feedback``) marks a task's state due; ``refresh`` refits when it is due, missing,
  stale (fitted on other verdicts than the log holds) or unreadable (a warning, then a refit), and otherwise
  picks up a newer file another process wrote. ``serving_state`` is the request path's view: it refreshes a due
  state, and looks for another process's newer file at most every ``check_interval`` seconds.
* **Cost.** A refit reads the verdicts, their stored request vectors and their logged predictions; the fit
  itself runs in a worker thread, so a batch's other requests keep going. The request path never embeds twice:
  the vector memory made for a request is reused (``TraceVectorCache``) and stored with its trace.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from cachetools import LRUCache
from numpy.typing import NDArray

from gil_core.errors import LearnedStateError
from gil_core.learned.fit import fit_state, prior_texts
from gil_core.learned.generation_floor import GENERATION_AUDIT
from gil_core.learned.judge import audited
from gil_core.learned.log import VerdictDigest, read_learned_log, verdict_digest
from gil_core.learned.state import LearnedState, read_state, state_key, task_key, write_state
from gil_core.llm.ports import EmbeddingModel
from gil_core.llm.recorder import current_trace_id
from gil_core.llm.trace_vectors import TraceVectorCache
from gil_core.storage import Folder
from gil_core.tasks import LearnedPolicy, TaskDefinition
from gil_core.telemetry import TelemetryStore, utc_now

__all__ = ["LearnedStateWarning", "Learner", "describe_nodes", "memory_configured", "stored_state", "task_key"]

_log = logging.getLogger("gil_core.learned")
_KEEP_FILES = 2  # the newest fits kept per tree and embedder (an older one is a fallback while a write lands)


class LearnedStateWarning(UserWarning):
    """A stored learned state could not be used and was refit from the log."""


class Learner:
    """The learned judges of the tasks one resolver serves (module doc). ``embedder`` embeds requests and prior
    texts; wrapped in a ``TraceVectorCache`` unless it is one."""

    def __init__(
        self,
        store: TelemetryStore,
        embedder: EmbeddingModel,
        *,
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._vectors = embedder if isinstance(embedder, TraceVectorCache) else TraceVectorCache(embedder)
        self._check_interval = check_interval
        self._clock = clock
        self._states: dict[str, LearnedState] = {}
        self._due: set[str] = set()
        self._checked: dict[str, float] = {}
        self._valid: dict[str, tuple[LearnedState, TaskDefinition]] = {}  # per task: the state last found valid
        self._locks: dict[str, asyncio.Lock] = {}
        self._priors: dict[str, NDArray[np.float32]] = {}
        self._texts: LRUCache[str, NDArray[np.float32]] = LRUCache(4096)
        self._request_vectors: LRUCache[tuple[str, str], NDArray[np.float32]] = LRUCache(512)
        self.fits = 0  # how many fits this learner ran (tests count them)

    @property
    def embedder(self) -> EmbeddingModel:
        return self._vectors

    # -- the request path ---------------------------------------------------------------------------------

    async def serving_state(self, task: TaskDefinition) -> LearnedState:
        """The state to judge ``task``'s next request with (module doc, "When")."""
        name = task.name
        state = self._states.get(name)
        if state is None or name in self._due or not self._valid_for(state, task):
            return await self.refresh(task)
        if self._clock() - self._checked.get(name, float("-inf")) >= self._check_interval:
            self._checked[name] = self._clock()
            newer = self._newest_readable(task, after=state.name)
            if newer is not None:
                self._states[name] = state = newer
        return state

    async def request_vector(self, text: str) -> NDArray[np.float32]:
        """The request's unit vector (one embedding call per request and trace). Inside a trace it is made once:
        every node of a walk asks for it, and the trace's vector does not change."""
        trace_id = current_trace_id()
        key = (trace_id, text) if trace_id is not None else None
        if key is not None and (kept := self._request_vectors.get(key)) is not None:
            return kept
        embeddings = await self._vectors.embed([text])
        vector = _unit(np.asarray(embeddings.vectors[0], dtype=np.float32))
        if key is not None:
            vector.flags.writeable = False  # shared by the nodes of the walk
            self._request_vectors[key] = vector
        return vector

    async def text_vectors(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Unit vectors of fixed texts (shadows' requests), kept once embedded."""
        missing = [text for text in dict.fromkeys(texts) if text not in self._texts]
        if missing:
            embeddings = await self._vectors.inner.embed(missing)
            for text, vector in zip(missing, embeddings.vectors, strict=True):
                self._texts[text] = _unit(np.asarray(vector, dtype=np.float32))
        return np.vstack([self._texts[text] for text in texts])

    def vector_row(self, task: str, trace_id: str, text: str) -> dict[str, Any] | None:
        """The ``vectors`` row of a request embedded in trace ``trace_id`` (None when it was not embedded)."""
        vector = self._vectors.vector(trace_id, text)
        if vector is None:
            return None
        array = np.asarray(vector, dtype="<f4")
        return {
            "trace_id": trace_id,
            "task": task,
            "created_at": utc_now(),
            "model": self._vectors.name,
            "dimensions": len(array),
            "vector": array.tobytes(),
        }

    def skips_generation(self, task: TaskDefinition, trace_id: str) -> str | None:
        """Why generation is not asked for this request of ``task`` (None: it is): the state in use says it does
        not help there (``learned.generation_floor``) and the trace is not one of the ``audit_rate`` share still
        asked (the same draw as the learned judge's audits, for no node)."""
        learned = task.policy.learned
        state = self._states.get(task.name) if learned is not None else None
        if learned is None or state is None or state.generation is None or state.asks_generation:
            return None
        if audited(trace_id, GENERATION_AUDIT, learned.audit_rate):
            return None
        return state.generation.describe()

    # -- feedback and refits ------------------------------------------------------------------------------

    def note_feedback(self, task: str) -> None:
        """A verdict on ``task`` was stored: its state is refit before it judges again."""
        self._due.add(task)

    async def refresh(self, task: TaskDefinition, *, force: bool = False) -> LearnedState:
        """Refit ``task``'s state if it is due, missing, stale or unreadable (or ``force``), else take the newest
        one stored; returns the state now in use."""
        lock = self._locks.setdefault(task.name, asyncio.Lock())
        async with lock:
            self._due.discard(task.name)
            self._checked[task.name] = self._clock()
            current = self._states.get(task.name)
            newest = self._newest_readable(task, after=current.name if current is not None else None)
            if newest is not None:
                current = newest
            if current is not None and not self._valid_for(current, task):
                current = None
            store = self._store  # a compaction deleting a file mid-read: read again (``TelemetryStore.rescanning``)
            digest = await asyncio.to_thread(store.rescanning, lambda: verdict_digest(store, task.name))
            if force or current is None or VerdictDigest.of(current.fitted_on) != digest:
                current = await self._fit(task, previous=current or self._previous(task))
            self._states[task.name] = current
            return current

    def state(self, task: str) -> LearnedState | None:
        """The state in use for ``task`` in this process, if one was loaded or fitted."""
        return self._states.get(task)

    def stored_state(self, task: TaskDefinition) -> LearnedState | None:
        """The newest readable state stored for ``task``'s tree and embedder, without fitting."""
        return self._newest_readable(task, after=None)

    async def _fit(self, task: TaskDefinition, *, previous: LearnedState | None) -> LearnedState:
        policy = _policy(task)
        priors = await self._prior_vectors(task)
        dimensions = len(next(iter(priors.values())))
        embedder = self._vectors.name

        def fit() -> LearnedState:
            log = self._store.rescanning(  # a compaction deleting a file mid-read: read again
                lambda: read_learned_log(
                    self._store, task.name, task.tree, none_text=task.language.none_of_these, embedder=embedder
                )
            )
            return fit_state(
                task=task.name,
                tree=task.tree,
                tree_sha256=_tree_sha256(task),
                threshold=task.policy.thresholds.for_node,
                policy=policy,
                log=log,
                priors=priors,
                embedder=embedder,
                dimensions=dimensions,
                previous=previous if previous is not None and self._valid_for(previous, task) else None,
                memory_threshold=memory_configured(task),
            )

        state = await asyncio.to_thread(fit)
        self.fits += 1
        folder = self._folder(task.name)
        name = f"{state.key}.{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}.parquet"
        write_state(folder, state, name)
        self._prune(folder, state.key)
        return LearnedState(**{**state.__dict__, "name": name})

    async def _prior_vectors(self, task: TaskDefinition) -> dict[str, NDArray[np.float32]]:
        texts = list(
            dict.fromkeys(
                text
                for node, _ in task.tree.iter_nodes()
                for item in (node.children or node.options)
                for text in prior_texts(task.tree, item)
            )
        )
        missing = [text for text in texts if text not in self._priors]
        if missing:
            embeddings = await self._vectors.embed(missing)
            for text, vector in zip(missing, embeddings.vectors, strict=True):
                self._priors[text] = _unit(np.asarray(vector, dtype=np.float32))
        return {text: self._priors[text] for text in texts}

    # -- stored states -----------------------------------------------------------------------------------

    def _folder(self, task: str) -> Folder:
        return self._store.side_folder("learned", task_key(task))

    def _newest_readable(self, task: TaskDefinition, *, after: str | None) -> LearnedState | None:
        """The newest stored state of the task's current key newer than ``after``; an unreadable newest file is
        removed with a warning (the caller refits)."""
        folder = self._folder(task.name)
        key = state_key(_tree_sha256(task), self._vectors.name)
        names = [name for name in folder.names() if name.startswith(key + ".")]
        if not names or (after is not None and names[-1] <= after):
            return None
        try:
            return read_state(folder, names[-1], task=task.name)
        except FileNotFoundError:  # pruned by another process between the listing and the read
            return None
        except LearnedStateError as exc:
            warnings.warn(f"{exc}: refitting from the log", LearnedStateWarning, stacklevel=2)
            _log.warning("%s: refitting from the log", exc)
            folder.remove([names[-1]])
            return None

    def _previous(self, task: TaskDefinition) -> LearnedState | None:
        return self._states.get(task.name)

    def _prune(self, folder: Folder, key: str) -> None:
        names = [name for name in folder.names() if name.startswith(key + ".")]
        folder.remove(names[:-_KEEP_FILES])

    def _valid_for(self, state: LearnedState, task: TaskDefinition) -> bool:
        """Fitted for this task's tree and embedder, with its learned_reflex and memory settings. Both are frozen:
        the pair last found valid for a task is known by identity (every request asks; the check hashes the tree
        and copies the policy)."""
        kept = self._valid.get(task.name)
        if kept is not None and kept[0] is state and kept[1] is task:
            return True
        configured = memory_configured(task)
        valid = (
            state.matches(task.name, _tree_sha256(task), self._vectors.name)
            and state.policy == _policy(task).to_json()
            and (state.memory.configured if state.memory is not None else None) == configured
        )
        if valid:
            self._valid[task.name] = (state, task)
        return valid


def stored_state(store: TelemetryStore, task: TaskDefinition) -> LearnedState | None:
    """The newest readable state stored for ``task``'s tree (fitted with any embedder), without fitting: what
    ``gil stats`` reports. None when there is none (or it is unreadable: the next refit replaces it)."""
    folder = store.side_folder("learned", task_key(task.name))
    prefix = state_key(_tree_sha256(task), "")[:16]
    for name in reversed(folder.names()):
        if name.startswith(prefix):
            try:
                return read_state(folder, name, task=task.name)
            except (LearnedStateError, FileNotFoundError):
                return None
    return None


def memory_configured(task: TaskDefinition) -> float | None:
    """The memory cut the task file sets that the log may move: ``memory_threshold`` when memory is on without
    a verify band (which keeps its own cuts) and ``learned_reflex.memory_cut`` is on, else None."""
    learned = task.policy.learned
    if task.policy.memory_verify is not None or learned is None or not learned.memory_cut:
        return None
    return task.policy.memory_threshold


def _policy(task: TaskDefinition) -> LearnedPolicy:
    policy = task.policy.learned
    if policy is None:
        raise LearnedStateError(f"task {task.name!r} has no learned_reflex")
    return policy


def _tree_sha256(task: TaskDefinition) -> str:
    return str(task.config()["tree_sha256"])


def _unit(vector: NDArray[np.float32]) -> NDArray[np.float32]:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def describe_nodes(state: LearnedState) -> list[dict[str, Any]]:
    """Per node, what ``gil fit-reflex`` and ``gil stats`` print: rows, classes, rule, cut, precision, coverage,
    and whether the next judge is still asked there (fit.py, "The next judge")."""
    rows = []
    for model in state.nodes.values():
        report: Mapping[str, Any] = model.report
        rows.append(
            {
                "node": model.node_id,
                "layer": model.layer,
                "rows": report.get("rows", 0),
                "classes": len(model.classes),
                "rule": model.rule,
                "evidence": model.evidence,
                "cut": model.cut,
                "precision": report.get("precision"),
                "lower_bound": report.get("lower_bound"),
                "p_value": report.get("p_value"),
                "support": report.get("support", 0),
                "coverage": report.get("coverage"),
                "logged": report.get("logged", 0),
                "novelty_cuts": report.get("novelty_cuts"),
                "asks_next_judge": model.asks_next_judge,
                "next_judge": report.get("next_judge"),
                "withheld": report.get("withheld"),
            }
        )
    return rows
