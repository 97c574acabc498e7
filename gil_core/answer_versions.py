"""Which tree answer a memory entry stands for, so that memory stops serving an answer the tree has changed since.

A verdict records the tree answer it confirmed in the traces table's ``answer_version`` column: the option's id and a
digest of what it answers with (``Option.answer_version``). Memory keys each entry by the trace that confirmed it, so
that row says what the entry stands for. A hit whose answer is no longer one of the tree's (an answer reworded or
removed, a procedure whose steps changed) and whose entry stood for a tree answer the tree no longer gives is refused:
the next nearest entry standing for what the tree gives now serves instead, if one is similar enough
(``gil_core.recall``). Entries are kept, so under the tree they were confirmed for they serve again; a rebuild from the
history leaves such entries out (``Feedback.rebuild_memory``). An entry that stands for no tree answer (a person's own
words, a generated answer, "none of these", a verdict recorded before the column existed) is served as before.

A process reads, once per task and tree, which entries stand for an answer the tree no longer gives (``StaleEntries``:
one scan of the task's verdicts for those rows, usually none), so a lookup never reads the log.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gil_core.habits.attribution import AnswerIndex
from gil_core.ontology import Tree
from gil_core.ontology.model import version_option
from gil_core.tasks import TaskDefinition

__all__ = ["ChangedAnswer", "StaleEntries", "TreeChange", "changed_answer", "changed_answers", "confirmed_version"]


def confirmed_version(
    tree: Tree,
    answers: AnswerIndex,
    *,
    answer: str | None,
    settled_by: str | None,
    none_text: str,
    served_from: str | None = None,
) -> str | None:
    """The ``Option.answer_version`` of the tree answer a verdict confirms, None when ``answer`` is none of them.

    ``settled_by`` is the option that gave the answer when the verdict confirms a tree walk's own answer (a
    procedure's answer is no text of the tree, so only the walk can say which it was); otherwise the answer's text
    (or filled template) names it. ``served_from`` is the version recorded for the memory entry that served the
    answer, for a confirmed memory hit whose answer the tree's texts do not name (an entry standing for a
    procedure).
    """
    if answer is None or answer.strip() == none_text:
        return None
    if settled_by is not None and tree.has_option(settled_by):
        return tree.option(settled_by).answer_version
    option = answers.option_for(answer)
    if option is not None:
        return tree.option(option).answer_version
    return served_from


def changed_answer(tree: Tree, version: str | None) -> str | None:
    """Why an entry standing for ``version`` must not be served under ``tree`` (None when it may): the option is
    gone, or it answers otherwise now."""
    if version is None or version in tree.answer_versions:
        return None
    option_id = version_option(version)
    if not tree.has_option(option_id):
        return f"tree: the remembered answer was the tree's {option_id!r}, which the tree no longer has"
    return f"tree: the remembered answer was the tree's {option_id!r}, which the tree has changed since"


@dataclass(frozen=True, slots=True)
class ChangedAnswer:
    """A tree answer that verdicts confirmed and another tree rewords (or gives other steps) or removes:
    ``remembered``, the memory entries standing for it, which memory stops serving; ``confirmed``, the verdicts
    confirming it, which the learned reflex goes on learning as its option unless ``removed``."""

    option_id: str
    removed: bool
    remembered: int
    confirmed: int


@dataclass(frozen=True, slots=True)
class TreeChange:
    """What a tree, put in place of a task's, changes of what the task learned: per answer it rewords or removes
    (``answers``), and ``remembered``, the entries memory holds (as a rebuild from the history would)."""

    answers: tuple[ChangedAnswer, ...]
    remembered: int

    @property
    def stops_serving(self) -> int:
        """The memory entries standing for an answer the tree no longer gives."""
        return sum(answer.remembered for answer in self.answers)


def changed_answers(
    tree: Tree, *, confirmed: Iterable[str | None], remembered: Iterable[str | None]
) -> tuple[ChangedAnswer, ...]:
    """Per option, what ``tree`` changes of what was learned: ``confirmed`` holds each verdict's recorded version
    (None for none), ``remembered`` each memory entry's. In option id order."""

    def by_option(versions: Iterable[str | None]) -> Counter[str]:
        return Counter(
            version_option(version) for version in versions if version and version not in tree.answer_versions
        )

    verdicts, entries = by_option(confirmed), by_option(remembered)
    return tuple(
        ChangedAnswer(option_id, not tree.has_option(option_id), entries[option_id], verdicts[option_id])
        for option_id in sorted(verdicts.keys() | entries.keys())
    )


class StaleEntries:
    """Per task, the entries whose verdict confirmed a tree answer the task's tree no longer gives, with that
    answer's version: read through ``load(task)`` once per tree (``TaskDefinition.schema``), then kept. Usually
    none, so a lookup costs a set probe. ``confirmed`` takes out entries a new verdict confirmed again (it records
    a version of the current tree). Thread-safe."""

    def __init__(self, load: Callable[[TaskDefinition], dict[str, str]]) -> None:
        self._load = load
        self._held: dict[str, tuple[str, dict[str, str]]] = {}  # per task: (schema, {key: version})
        self._lock = threading.Lock()

    def version(self, task: TaskDefinition, key: str) -> str | None:
        """The version entry ``key`` stood for, when the task's tree no longer gives it (else None)."""
        with self._lock:
            held = self._held.get(task.name)
        if held is None or held[0] != task.schema:
            held = (task.schema, self._load(task))
            with self._lock:
                self._held[task.name] = held
        return held[1].get(key)

    def confirmed(self, task: str, keys: Iterable[str]) -> None:
        with self._lock:
            held = self._held.get(task)
            if held is not None:
                for key in keys:
                    held[1].pop(key, None)
