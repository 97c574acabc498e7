"""What memory should hold after a history of verdicts, so a lost or new store can be rebuilt from feedback.

The rules are live feedback's, applied in order: a ``wrong`` verdict on a ``memory``-mode trace forgets the
entry that answered it (``recall_source``); a ``correct`` verdict remembers the trace's output (key = trace id);
a ``wrong`` verdict with a correction remembers the correction. A later verdict on the same trace overturns the
earlier one: its entry is replaced, or removed when the later verdict remembers nothing. Outputs and corrections
are stripped; an empty one remembers nothing.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from gil_core import verdicts
from gil_core.errors import ConfigurationError
from gil_core.memory.ports import Memory, MemoryEntry

__all__ = ["FeedbackEvent", "Verdict", "plan_memory", "rebuild_memory"]

Verdict = Literal["correct", "wrong"]


@dataclass(frozen=True, slots=True)
class FeedbackEvent:
    """One verdict on one resolved request: what was asked, how it was answered, and what the reviewer said.

    ``mode`` is the trace's mode (``memory``, ``habit/answer``, ``fallback``, …); ``recall_source`` is the key of
    the memory entry that answered it, when memory did; ``answer_version`` the tree answer the verdict confirmed
    (``Option.answer_version``), when it confirmed one and recorded it.
    """

    trace_id: str
    text: str
    mode: str
    output: str | None
    verdict: Verdict
    correction: str | None
    recall_source: str | None
    answer_version: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in get_args(Verdict):
            raise ConfigurationError(f"verdict must be one of {get_args(Verdict)}, got {self.verdict!r}")

    def confirmed_answer(self) -> str | None:
        """The answer this verdict confirms for ``text`` (``gil_core.verdicts``): the output when correct, the
        correction when wrong."""
        return verdicts.confirmed_answer(self.verdict, self.output, self.correction)


def plan_memory(events: Iterable[FeedbackEvent], *, answers_now: Container[str] | None = None) -> list[MemoryEntry]:
    """The entries memory holds after ``events`` were applied in order, in insertion order. With ``answers_now``
    (the tree's ``answer_versions``), a verdict that confirmed a tree answer the tree no longer gives confirms
    nothing: the entry would be refused at every lookup."""
    held: dict[str, MemoryEntry] = {}
    for event in events:
        if event.verdict == "wrong" and event.mode == "memory" and event.recall_source is not None:
            held.pop(event.recall_source, None)
        held.pop(event.trace_id, None)  # a later verdict overturns the earlier one
        answer = event.confirmed_answer()
        version = event.answer_version
        if answers_now is not None and version is not None and version not in answers_now:
            continue  # a tree answer the tree no longer gives: the entry would be refused at every lookup
        if answer is not None and event.text:  # a request recorded without its text cannot be remembered
            held[event.trace_id] = MemoryEntry(key=event.trace_id, text=event.text, answer=answer)
    return list(held.values())


async def rebuild_memory(
    memory: Memory, task: str, events: Iterable[FeedbackEvent], *, answers_now: Container[str] | None = None
) -> None:
    """Make ``task``'s memory hold exactly what ``events`` confirm (see ``plan_memory``)."""
    await memory.rebuild(task, plan_memory(events, answers_now=answers_now))
