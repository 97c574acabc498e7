"""The retry loop generation and slot filling share: ask, check, and feed the complaint into the next ask."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gil_core.errors import ConfigurationError
from gil_core.fallback.contracts import Violation
from gil_core.llm.options import Contract, call_options, current_call_options
from gil_core.llm.ports import ChatModel, Message
from gil_core.llm.recorder import call_scope
from gil_core.telemetry.records import CallRole

T = TypeVar("T")


def check_budget(max_attempts: int, max_tokens: int) -> None:
    """Both limits must allow at least one reply."""
    if max_attempts < 1 or max_tokens < 1:
        raise ConfigurationError(f"max_attempts and max_tokens must be at least 1 ({max_attempts}, {max_tokens})")


@dataclass(frozen=True, slots=True)
class Attempts(Generic[T]):
    """How a run of attempts ended: the accepted value, or the last complaint and reply when none was. The
    complaint of a do-not-record call does not quote the reply (``Violation.unquoted``): a reply can echo its
    request, and a complaint ends up in the trace's failure, the results file and the logs."""

    value: T | None
    attempts: int
    complaint: str | None
    last_output: str | None
    energy: float


@dataclass(frozen=True, slots=True)
class Asker:
    """One model with the settings every attempt is made with."""

    model: ChatModel
    role: CallRole
    max_attempts: int
    max_tokens: int
    extra_body: Mapping[str, Any] | None

    async def ask(
        self,
        build: Callable[[str | None], Sequence[Message]],
        check: Callable[[str], T | Violation],
        *,
        node_id: str | None,
        contract: Contract | None = None,
    ) -> Attempts[T]:
        """Up to ``max_attempts`` calls at temperature 0; ``build(complaint)`` makes each request, the last
        violation's complaint included from the second on. Model errors propagate: they are not violations.

        Each call carries its attempt number and ``contract`` in ``call_options``, so a request cache serves
        only first attempts and re-validates what it stored against the contract of this call."""
        complaint: str | None = None
        kept: str | None = None
        output: str | None = None
        energy = 0.0
        private = current_call_options().do_not_record
        for attempt in range(1, self.max_attempts + 1):
            with call_options(attempt=attempt, contract=contract), call_scope(self.role, node_id=node_id) as scope:
                completion = await self.model.complete(
                    build(complaint), max_tokens=self.max_tokens, temperature=0.0, extra_body=self.extra_body
                )
            energy += scope.energy
            output = completion.content
            verdict = check(output)
            if not isinstance(verdict, Violation):
                return Attempts(verdict, attempt, None, output, energy)
            complaint = verdict.complaint  # the model is told what it said
            kept = verdict.recordable if private else verdict.complaint
        return Attempts(None, self.max_attempts, kept, output, energy)
