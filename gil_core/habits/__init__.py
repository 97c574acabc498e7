"""What the log says about habits: attribution of verdicts, shadows, and the review rounds (promotion,
deactivation, differentiation) with their decision log."""

from gil_core.habits.attribution import ReliabilityDelta, attribute_verdict
from gil_core.habits.costs import EvidenceTrace, JudgeCostModel
from gil_core.habits.deactivation import DeactivationPolicy, ReliabilityWeights, propose_deactivations
from gil_core.habits.differentiation import (
    DifferentiationPolicy,
    anchored_signals,
    capacity_signals,
    group_unserved,
)
from gil_core.habits.promotion import PromotionLog, PromotionPolicy, propose_promotions, review_promotions
from gil_core.habits.review_log import Decision, ReviewKind, ReviewLog
from gil_core.habits.shadows import Evidence, build_shadow_index, confirmed_answer
from gil_core.habits.thresholds import (
    MemoryBands,
    ThresholdChoice,
    ThresholdReport,
    choose_memory_bands,
    choose_threshold,
    select_memory_bands,
    select_thresholds,
)

__all__ = [
    "DeactivationPolicy",
    "Decision",
    "DifferentiationPolicy",
    "Evidence",
    "EvidenceTrace",
    "JudgeCostModel",
    "MemoryBands",
    "PromotionLog",
    "PromotionPolicy",
    "ReliabilityDelta",
    "ReliabilityWeights",
    "ReviewKind",
    "ReviewLog",
    "ThresholdChoice",
    "ThresholdReport",
    "anchored_signals",
    "attribute_verdict",
    "build_shadow_index",
    "capacity_signals",
    "choose_memory_bands",
    "choose_threshold",
    "confirmed_answer",
    "group_unserved",
    "propose_deactivations",
    "propose_promotions",
    "review_promotions",
    "select_memory_bands",
    "select_thresholds",
]
