"""Turning the first token's top logprobs into a distribution over the labels a judge prompt showed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gil_core.llm.ports import TokenLogprob
from gil_core.telemetry.records import CandidateShown

__all__ = ["DEFAULT_TRUST_THRESHOLD", "LabelDistribution", "Outcome", "read_distribution"]

DEFAULT_TRUST_THRESHOLD = 0.9
Outcome = Literal["accept", "exit"]


@dataclass(frozen=True, slots=True)
class LabelDistribution:
    """What one judgment says.

    ``probs`` maps each candidate id to its renormalised probability; ``none_prob`` is that of "none of these".
    ``label_mass`` is the raw probability the model put on valid labels at all. ``confidence`` is the winning
    label's probability, even when "none" wins. ``choice`` is None when the judgment is untrusted or none wins.
    """

    probs: Mapping[str, float]
    none_prob: float
    label_mass: float
    confidence: float
    trusted: bool
    choice: str | None
    winner: str | None = field(default=None)

    @property
    def outcome(self) -> Outcome:
        return "accept" if self.choice is not None else "exit"

    @property
    def none_selected(self) -> bool:
        """True when the most probable label was "none of these"."""
        return self.winner is None


def read_distribution(
    top_logprobs: Sequence[TokenLogprob],
    shown: Sequence[CandidateShown],
    *,
    trust_threshold: float = DEFAULT_TRUST_THRESHOLD,
) -> LabelDistribution:
    """Sum ``exp(logprob)`` per shown label (tokens stripped of white space; null logprob = 0), renormalise,
    and pick the most probable label, ties going to the label that sorts first."""
    by_symbol = {item.shown_as: item for item in shown}
    # Exact (fsum) sums make the figures independent of the order the server listed tokens in, and match the
    # reference's to the bit.
    terms: dict[str, list[float]] = {symbol: [] for symbol in by_symbol}
    for alternative in top_logprobs:
        symbol = alternative.token.strip()
        if symbol in terms and alternative.logprob is not None:
            terms[symbol].append(math.exp(alternative.logprob))
    label_mass = math.fsum(value for values in terms.values() for value in values)
    probs = {symbol: (math.fsum(values) / label_mass if label_mass > 0 else 0.0) for symbol, values in terms.items()}
    winner_symbol = min(probs, key=lambda symbol: (-probs[symbol], symbol))
    winner = by_symbol[winner_symbol]
    trusted = label_mass >= trust_threshold
    none_symbols = [item.shown_as for item in shown if item.id is None]
    return LabelDistribution(
        probs={item.id: probs[item.shown_as] for item in shown if item.id is not None},
        none_prob=sum(probs[symbol] for symbol in none_symbols),
        label_mass=label_mass,
        confidence=probs[winner_symbol],
        trusted=trusted,
        choice=winner.id if trusted and winner.id is not None else None,
        winner=winner.id,
    )
