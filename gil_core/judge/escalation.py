"""The one rule for escalating from a reflex to the deliberate (LLM) judge, shared by ``TieredJudge`` (a tree
node's judgment) and the judgment router (choose / score / ask).

A reflex's answer is served when it is trusted, its confidence reaches the threshold (``>=``; a NaN confidence
never does), and it is not an answer the caller defers to the LLM (the tree's "none of these", by default);
otherwise the deliberate judge is asked. A reflex that failed (a ``ModelError``) escalates too: each caller
catches that itself, since only it knows what to record of the failure.
"""

from __future__ import annotations

__all__ = ["reflex_serves"]


def reflex_serves(confidence: float, threshold: float, *, trusted: bool = True, deferred: bool = False) -> bool:
    """Whether a reflex's answer with ``confidence`` is served at ``threshold`` (module doc)."""
    return trusted and not deferred and confidence >= threshold
