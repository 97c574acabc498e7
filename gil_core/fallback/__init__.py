"""Answers the tree has no habit for: generation under a reply contract, template slots, procedures."""

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
from gil_core.fallback.generator import FallbackGenerator, Generation, build_fallback_messages
from gil_core.fallback.procedures import run_procedure
from gil_core.fallback.slots import SlotFill, SlotFiller, build_slot_messages

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
    "run_procedure",
]
