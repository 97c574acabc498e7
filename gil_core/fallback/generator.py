"""The fallback generator: when no habit answers a request, the model writes the answer under a contract.

The prompt layout is the reference's, byte for byte in Korean (conformance/prompts.json "fallbacks"), so
recorded fallback costs stay comparable. A violated contract is fed back on the retry; an answer "outside this
category" under a narrowed tree contract reruns once under the whole tree, without the path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gil_core.fallback._attempts import Asker, Attempts, check_budget
from gil_core.fallback.contracts import Accepted, Contract, TreeAnswerContract, Violation
from gil_core.language import PromptLanguage, fill
from gil_core.llm.ports import ChatModel, Message

__all__ = ["FallbackGenerator", "Generation", "build_fallback_messages"]


@dataclass(frozen=True, slots=True)
class Generation:
    """What generation produced: the accepted answer (None when every attempt broke the contract), the calls
    it took, the last complaint when it failed (for a do-not-record call, without the reply's words: a reply can
    echo its request), the priced energy, and whether it reran under the whole tree."""

    output: str | None
    attempts: int
    complaint: str | None
    energy: float
    widened: bool = False


def build_fallback_messages(
    language: PromptLanguage,
    request: str,
    contract: Contract,
    *,
    path: Sequence[str] = (),
    examples: Sequence[str] = (),
    instructions: str | None = None,
    complaint: str | None = None,
) -> list[Message]:
    """System = the fallback instruction; user = the framed request, then (each only when given) the path
    scope, the examples, the instructions, then the contract, then the complaint about the last reply."""
    sections = [language.with_input(request)]
    if path:
        sections.append(fill(language.path_scope, {"path": language.path_separator.join(path)}))
    if examples:
        items = "\n".join(fill(language.list_item, {"item": example}) for example in examples)
        sections.append(fill(language.examples, {"examples": items}))
    if instructions is not None:
        sections.append(fill(language.instructions, {"instructions": instructions}))
    sections.append(contract.instruction(language))
    if complaint is not None:
        sections.append(fill(language.complaint, {"complaint": complaint}))
    return [
        {"role": "system", "content": language.fallback_system},
        {"role": "user", "content": language.section_separator.join(sections)},
    ]


class FallbackGenerator:
    """Asks ``model`` for an answer under a contract, up to ``max_attempts`` times, at temperature 0."""

    def __init__(
        self,
        model: ChatModel,
        language: PromptLanguage,
        *,
        max_attempts: int = 3,
        max_tokens: int = 512,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        check_budget(max_attempts, max_tokens)
        self._language = language
        self._asker = Asker(model, "fallback", max_attempts, max_tokens, extra_body)

    @property
    def language(self) -> PromptLanguage:
        return self._language

    async def generate(
        self,
        request: str,
        contract: Contract,
        *,
        path: Sequence[str] = (),
        examples: Sequence[str] = (),
        instructions: str | None = None,
        node_id: str | None = None,
    ) -> Generation:
        """The answer under ``contract``; calls are recorded with role ``fallback`` and ``node_id``."""
        first = await self._run(request, contract, path, examples, instructions, node_id)
        if not (
            isinstance(contract, TreeAnswerContract)
            and contract.scope is not None
            and first.value is not None
            and contract.is_escape(first.value, self._language)
        ):
            return _generation(first, first.attempts, first.energy, widened=False)
        # Out of category: the path was wrong, not the request unanswerable; ask again over the whole tree.
        second = await self._run(request, contract.widened(), (), examples, instructions, node_id)
        return _generation(second, first.attempts + second.attempts, first.energy + second.energy, widened=True)

    async def _run(
        self,
        request: str,
        contract: Contract,
        path: Sequence[str],
        examples: Sequence[str],
        instructions: str | None,
        node_id: str | None,
    ) -> Attempts[str]:
        def build(complaint: str | None) -> list[Message]:
            return build_fallback_messages(
                self._language,
                request,
                contract,
                path=path,
                examples=examples,
                instructions=instructions,
                complaint=complaint,
            )

        def check(output: str) -> str | Violation:
            verdict = contract.validate(output, self._language)
            return verdict.answer if isinstance(verdict, Accepted) else verdict

        return await self._asker.ask(build, check, node_id=node_id, contract=contract)


def _generation(last: Attempts[str], attempts: int, energy: float, *, widened: bool) -> Generation:
    return Generation(last.value, attempts, last.complaint, energy, widened)
