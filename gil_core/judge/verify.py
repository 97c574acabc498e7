"""Verifying a memory hit: one single-token yes/no judgment of whether two requests ask for the same thing.

Similarity alone cannot tell "cancel my order" from "don't cancel my order". Where the similarity of a memory
hit is unsure (between the task's ``memory_verify`` and ``memory_accept``), the resolver shows the model the
request and the remembered request and asks. The wording lives in ``PromptLanguage`` (``verify_*``); the call
is recorded with role ``verify`` and annotated with the yes/no distribution it read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from gil_core.judge.primitives import YesNo
from gil_core.language import PromptLanguage, fill
from gil_core.llm.ports import ChatModel, Message, TokenLogprob
from gil_core.llm.recorder import call_scope

__all__ = ["SameRequestVerifier", "Verifier", "build_verify_messages", "read_yes_no"]

_TOP_LOGPROBS = 20


@runtime_checkable
class Verifier(Protocol):
    """Decides whether ``request`` asks for the same thing as ``remembered``, with a confidence."""

    async def verify(self, request: str, remembered: str) -> YesNo: ...


def build_verify_messages(language: PromptLanguage, request: str, remembered: str) -> list[Message]:
    """The system and user messages of one verification."""
    question = fill(language.verify_question, {"remembered": remembered})
    return [
        {"role": "system", "content": language.verify_system},
        {"role": "user", "content": language.with_input(request) + language.section_separator + question},
    ]


def read_yes_no(top_logprobs: Sequence[TokenLogprob], yes: str, no: str) -> tuple[float, float]:
    """P(yes) and P(no) among the first token's alternatives (case and white space ignored), normalised over
    the two. Mass on neither word counts for neither: with no mass on both, the verdict is an even 0.5/0.5,
    which no confidence threshold above one half accepts."""
    masses = {yes.casefold(): 0.0, no.casefold(): 0.0}
    for alternative in top_logprobs:
        token = alternative.token.strip().casefold()
        if token in masses and alternative.logprob is not None:
            masses[token] += math.exp(alternative.logprob)
    p_yes, p_no = masses[yes.casefold()], masses[no.casefold()]
    total = p_yes + p_no
    if total <= 0.0:
        return 0.5, 0.5
    return p_yes / total, p_no / total


class SameRequestVerifier:
    """``Verifier`` over a chat model: one call, ``max_tokens=1``, temperature 0, with logprobs."""

    def __init__(
        self, model: ChatModel, language: PromptLanguage, *, extra_body: Mapping[str, Any] | None = None
    ) -> None:
        self._model = model
        self._language = language
        self._extra_body = extra_body

    async def verify(self, request: str, remembered: str) -> YesNo:
        language = self._language
        messages = build_verify_messages(language, request, remembered)
        with call_scope("verify") as scope:
            completion = await self._model.complete(
                messages, max_tokens=1, temperature=0.0, top_logprobs=_TOP_LOGPROBS, extra_body=self._extra_body
            )
            p_yes, p_no = read_yes_no(completion.top_logprobs, language.verify_yes, language.verify_no)
            verdict = YesNo(p_yes > p_no, max(p_yes, p_no))
            scope.annotate(
                distribution={language.verify_yes: p_yes, language.verify_no: p_no},
                confidence=verdict.confidence,
                outcome="accept" if verdict.yes else "exit",
            )
        return verdict
