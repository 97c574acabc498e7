"""Answers the tree has no habit for: generation under a reply contract, template slots, procedures.

The reply contracts load at once (a task file names them); the generator, slots and procedures, which need the
model adapters and the recorder, load on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gil_core._lazy import lazy_names
from gil_core.fallback.contracts import (
    Accepted,
    ChoiceContract,
    Contract,
    ScoreContract,
    TextContract,
    TreeAnswerContract,
    Verdict,
    Violation,
)

if TYPE_CHECKING:
    from gil_core.fallback.generator import FallbackGenerator, Generation, build_fallback_messages
    from gil_core.fallback.procedures import run_procedure
    from gil_core.fallback.slots import SlotFill, SlotFiller, build_slot_messages, filled_without_model

_HOMES = {
    "gil_core.fallback.generator": ("FallbackGenerator", "Generation", "build_fallback_messages"),
    "gil_core.fallback.procedures": ("run_procedure",),
    "gil_core.fallback.slots": ("SlotFill", "SlotFiller", "build_slot_messages", "filled_without_model"),
}
__all__ = [
    "Accepted",
    "ChoiceContract",
    "Contract",
    "FallbackGenerator",
    "Generation",
    "ScoreContract",
    "SlotFill",
    "SlotFiller",
    "TextContract",
    "TreeAnswerContract",
    "Verdict",
    "Violation",
    "build_fallback_messages",
    "build_slot_messages",
    "filled_without_model",
    "run_procedure",
]
__getattr__ = lazy_names(__name__, _HOMES, globals())
