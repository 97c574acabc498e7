"""What the log says about habits: attribution of verdicts, and shadows (known answers not yet habits)."""

from gil_core.habits.attribution import ReliabilityDelta, attribute_verdict
from gil_core.habits.shadows import Evidence, build_shadow_index, confirmed_answer

__all__ = ["Evidence", "ReliabilityDelta", "attribute_verdict", "build_shadow_index", "confirmed_answer"]
