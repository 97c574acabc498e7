"""Whether generation is still asked, read from the log (with the learned judge on).

When the tree does not settle a request, Gil generates an answer under the task's contract: a prompt of a few
hundred tokens and a generated reply, the most expensive call a request can make. A model that cannot answer
these requests (on the bundled streams, the 135M local model never generated a confirmed answer) spends that for
nothing, and the request ends without an answer either way. The log says which it is: every request that went
to generation (trace mode ``fallback`` or ``partial``) and then got a verdict tells whether the generated answer
was confirmed (verdict "correct") or not.

Over the latest ``window`` such requests whose verdicts the feedback queue did not choose (``learned.queue``:
the queue asks about what the learned judge is least sure of, which would bias this share low), the share
generation got right and its Wilson 95% upper bound. Where that bound is below ``generation_floor``, generation
is asked only on the ``audit_rate`` share of the requests that reach it (the same draw per trace as the learned
judge's audits), which keeps the count current: one confirmed answer among 80 asks lifts the bound above 5%.
Elsewhere the request ends as ``abstain``, its failure saying why. A model that generates well is never marked;
``generation_floor: 0`` always asks. Procedures (an answer the tree holds as steps) are not counted or skipped:
there the tree chose the answer and generation only words it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gil_core.wilson import wilson_interval

__all__ = ["GENERATION_AUDIT", "GENERATION_MODES", "Generated", "GenerationFloor", "fit_generation_floor"]

GENERATION_MODES = frozenset({"fallback", "partial"})
"""The trace modes of a request the tree left to generation (a procedure's ``habit/procedure`` is not one)."""

GENERATION_AUDIT = "\x1egeneration"
"""The place ``learned.judge.audited`` draws a trace's generation audit for: no node id (ids are names)."""


@dataclass(frozen=True, slots=True)
class Generated:
    """A request that went to generation and has a verdict: whether the verdict confirmed the generated answer,
    and how its trace was chosen for the verdict (``learned.queue``)."""

    order: int
    right: bool
    chosen_by: str = "unsolicited"


@dataclass(frozen=True, slots=True)
class GenerationFloor:
    """What the log says of generation for a task (module doc): ``asked`` requests read, ``right`` of them
    confirmed, the Wilson 95% upper bound of that share, the floor it was held to, and whether generation is
    still asked on every request (``ask``) or only on the audit share."""

    asked: int
    right: int
    upper_bound: float
    floor: float
    ask: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "asked": self.asked,
            "right": self.right,
            "upper_bound": self.upper_bound,
            "floor": self.floor,
            "ask": self.ask,
        }

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> GenerationFloor:
        return cls(
            asked=int(value["asked"]),
            right=int(value["right"]),
            upper_bound=float(value["upper_bound"]),
            floor=float(value["floor"]),
            ask=bool(value["ask"]),
        )

    def describe(self) -> str:
        """One line for ``gil fit-reflex``, and the failure text of a request generation was not asked for."""
        said = f"generated the confirmed answer for {self.right} of the latest {self.asked} requests it was asked"
        if self.ask:
            return f"generation asked ({said})" if self.asked else "generation asked (no verdicts on it yet)"
        return (
            f"generation asked on audits only ({said}; Wilson 95% upper bound {self.upper_bound:.1%} "
            f"< generation_floor {self.floor:g})"
        )


def fit_generation_floor(generated: Sequence[Generated], *, floor: float, window: int) -> GenerationFloor:
    """The generation floor the log supports (module doc)."""
    asked = [item for item in generated if item.chosen_by != "queue"][-window:]
    right = sum(item.right for item in asked)
    upper = wilson_interval(right, len(asked))[1] if asked else 1.0
    return GenerationFloor(len(asked), right, upper, floor, not (floor > 0.0 and upper < floor))
