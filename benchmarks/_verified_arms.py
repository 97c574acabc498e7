"""Part C's verification arms (issue #10): the accept/verify bands chosen on the calibration half, a one-token
"same request?" judgment in the band between them, and per-entry evidence.

Two verifiers are measured, so the gain of the mechanism is told apart from the quality of the model:

- an **oracle** (a scripted chat model that answers "yes" exactly when the remembered question is the request's
  own duplicate): what the bands and the evidence can do with a perfect judge;
- the **local model** (SmolLM2-135M on llama.cpp's server), through the same ``SameRequestVerifier`` the resolver
  uses.

Both go through ``gil_core.judge.verify.SameRequestVerifier``: the prompt, the yes/no reading and the
``verify_confidence`` bar are the product's own.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from benchmarks._pair_lookups import Decision, Lookup
from gil_core.habits.thresholds import choose_memory_bands
from gil_core.judge.verify import SameRequestVerifier, Verifier
from gil_core.language import ENGLISH
from gil_core.llm.ports import Message
from gil_core.memory.evidence import MemoryEvidence
from gil_core.testing import ScriptedChatModel, ScriptedReply

ACCEPT_PRECISION = 0.99
VERIFY_PRECISION = 0.5
VERIFY_CONFIDENCE = 0.8
MINIMUM_ANSWERED = 20
LOCAL_SAMPLE = 400  # evaluation lookups the local model verifies in a full run (seeded sample)
LOCAL_SAMPLE_QUICK = 40

_REQUEST = re.compile(r"<request>\n(.*)\n</request>", re.DOTALL)
_EARLIER = re.compile(r"<earlier>\n(.*)\n</earlier>", re.DOTALL)

VerifierFactory = Callable[[Sequence[Lookup]], AbstractAsyncContextManager[Verifier]]


def oracle_verifier(lookups: Sequence[Lookup]) -> AbstractAsyncContextManager[Verifier]:
    """A verifier that is always right: "yes" exactly for (request, remembered) pairs that are right."""
    right = {(item.pair.b, item.nearest) for item in lookups if item.right}

    def respond(messages: Sequence[Message], **_: Any) -> ScriptedReply:
        user = messages[-1]["content"]
        request, earlier = _REQUEST.search(user), _EARLIER.search(user)
        same = request is not None and earlier is not None and (request.group(1), earlier.group(1)) in right
        return ScriptedReply("yes" if same else "no")

    @asynccontextmanager
    async def opened() -> Any:
        yield SameRequestVerifier(ScriptedChatModel(name="oracle", responder=respond), ENGLISH)

    return opened()


@asynccontextmanager
async def _local(lookups: Sequence[Lookup]) -> Any:
    from gil_core.llm import OpenAICompatibleChatModel
    from gil_core.local import LocalLLMServer  # the `local` extra

    server = LocalLLMServer.ensure()  # the shared server `chat_model: local` uses: started once, then reused
    async with OpenAICompatibleChatModel(server.base_url, server.model) as chat:
        yield SameRequestVerifier(chat, ENGLISH)


def local_verifier(lookups: Sequence[Lookup]) -> AbstractAsyncContextManager[Verifier]:
    return _local(lookups)


@dataclass(frozen=True)
class VerifiedBands:
    """Serve at or above ``accept``; verify from ``verify`` up to it (both chosen on the calibration half for
    ``ACCEPT_PRECISION`` and ``VERIFY_PRECISION``). With ``evidence``, lookups are replayed in order with the
    answer key as feedback: an entry whose served hits were confirmed is served without a verification down to
    its per-entry threshold, and an entry whose hit was wrong is forgotten (later lookups of it miss)."""

    verifier_name: str
    factory: VerifierFactory
    evidence: bool = False
    sample: int | None = None

    @property
    def name(self) -> str:
        base = f"selected bands + verification ({self.verifier_name})"
        return base + (" + per-entry evidence" if self.evidence else "")

    async def decide(self, calibration: Sequence[Lookup], evaluation: Sequence[Lookup]) -> Decision:
        bands = choose_memory_bands(
            [item.similarity for item in calibration],
            [item.right for item in calibration],
            accept_precision=ACCEPT_PRECISION,
            verify_precision=VERIFY_PRECISION,
            minimum_answered=MINIMUM_ANSWERED,
        )
        verify = bands.verify.threshold
        if verify is None:
            return Decision([False] * len(evaluation), None, "no verify threshold reaches the verify precision")
        accept = bands.accept.threshold if bands.accept.threshold is not None else float("inf")
        # With no accept threshold every hit is verified; per-entry evidence then lowers the bar from the top of
        # the cosine scale (1.0), as from an accept threshold.
        evidence_top = min(accept, 1.0)
        chosen = _sample(len(evaluation), self.sample)
        served = [False] * len(evaluation)
        verifications = 0
        ledger = MemoryEvidence()
        forgotten: set[str] = set()
        async with self.factory(evaluation) as verifier:
            for index in chosen:
                item = evaluation[index]
                if item.similarity < verify or item.nearest in forgotten:
                    continue
                bar = ledger.threshold(item.nearest, accept=evidence_top, verify=verify) if self.evidence else accept
                if item.similarity >= bar:
                    served[index] = True
                else:
                    verifications += 1
                    verdict = await verifier.verify(item.pair.b, item.nearest)
                    served[index] = verdict.yes and verdict.confidence >= VERIFY_CONFIDENCE
                if served[index] and self.evidence:  # the answer key's verdict on the served hit
                    ledger.record(f"lookup-{index}", item.nearest, item.right)
                    if not item.right:
                        forgotten.add(item.nearest)
        accept_text = f"{accept:.4f}" if accept != float("inf") else "none (every hit is verified)"
        counted = len(chosen)
        note = (
            f"accept {accept_text}, verify {verify:.4f}; {verifications:,} of {counted:,} lookups "
            f"({verifications / counted:.1%}) paid for a verification"
        )
        if counted < len(evaluation):
            note += f"; a seeded sample of {counted:,} of the {len(evaluation):,} evaluation lookups"
            served = [served[index] for index in chosen]
        extra = {"verified share": f"{verifications / counted:.1%}", "lookups counted": f"{counted}"}
        return Decision(served, verify, note, extra)


def _sample(total: int, size: int | None) -> list[int]:
    if size is None or size >= total:
        return list(range(total))
    return sorted(random.Random(11).sample(range(total), size))


def verification_arms(quick: bool, *, local: bool = True) -> list[VerifiedBands]:
    """The arms issue #10 adds: oracle and local verifier, each without and with per-entry evidence."""
    arms = [VerifiedBands("oracle", oracle_verifier), VerifiedBands("oracle", oracle_verifier, evidence=True)]
    if local:
        size = LOCAL_SAMPLE_QUICK if quick else LOCAL_SAMPLE
        arms += [
            VerifiedBands("local SmolLM2-135M", local_verifier, sample=size),
            VerifiedBands("local SmolLM2-135M", local_verifier, evidence=True, sample=size),
        ]
    return arms


def subset(evaluation: Sequence[Lookup], decision: Decision, arm: VerifiedBands) -> Sequence[Lookup]:
    """The evaluation lookups an arm's decision is about (a sample for the local model)."""
    if len(decision.served) == len(evaluation):
        return evaluation
    return [evaluation[index] for index in _sample(len(evaluation), arm.sample)]


__all__ = [
    "VerifiedBands",
    "local_verifier",
    "oracle_verifier",
    "subset",
    "verification_arms",
]
