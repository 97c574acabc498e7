"""Every piece of wording a model reads, held in one frozen value object per language.

``KOREAN`` is byte-exact with the reference's measured prompts (conformance/prompts.json); ``ENGLISH`` is ours.
Replace any piece with ``dataclasses.replace(ENGLISH, judge_system=...)``. Placeholders are ``{name}`` and are
filled in one pass by :func:`fill`: text inserted for one placeholder is never scanned for another.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gil_core.errors import ConfigurationError

__all__ = ["ENGLISH", "KOREAN", "NONE_NAMES", "PromptLanguage", "fill", "placeholders"]

NONE_NAMES = ("none", "none of these")
"""How an answer key or an export may name "none of these", besides a task's own wording of it."""

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def placeholders(template: str) -> list[str]:
    """The placeholder names in ``template``, in order of appearance."""
    return _PLACEHOLDER.findall(template)


def fill(template: str, values: Mapping[str, object]) -> str:
    """Replace each ``{name}`` with ``values[name]`` in a single pass. A missing value is a ConfigurationError."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ConfigurationError(f"no value for placeholder {{{name}}} in {template!r}")
        return str(values[name])

    return _PLACEHOLDER.sub(substitute, template)


@dataclass(frozen=True, slots=True)
class PromptLanguage:
    """The wording of every prompt, in one language. Fields ending in a template take ``{placeholders}``."""

    name: str
    # Shared layout.
    section_separator: str
    input: str  # {input}
    list_item: str  # {item}
    none_of_these: str
    out_of_category: str
    # The single-token judge.
    judge_system: str
    judge_question: str  # {choices}
    judge_none_choice: str  # {symbol} {none}
    judge_choice: str  # {symbol} {label} {description}
    # Generation under a contract.
    fallback_system: str
    path_scope: str  # {path}
    path_separator: str
    examples: str  # {examples}
    complaint: str  # {complaint}
    contract_text: str
    contract_text_max: str  # {max_length}
    contract_choice: str  # {choices}
    choice_separator: str
    contract_score: str  # {low} {high}
    contract_tree: str  # {choices}
    tree_choice_example: str  # {description}
    # What a violated contract is told on the retry.
    violation_empty: str
    violation_not_integer: str  # {value}
    violation_out_of_range: str  # {value} {low} {high}
    violation_too_long: str  # {length} {max_length}
    violation_not_a_choice: str  # {value}
    # Our additions (not in the reference's fixtures): a procedure's steps, and a template's blanks.
    instructions: str  # {instructions}
    slot_system: str
    slot_template: str  # {template}
    slot_question: str  # {blanks}
    slot_blank: str  # {name} {instruction}
    blank_separator: str
    violation_not_json: str  # {names}
    violation_missing_blanks: str  # {names}
    # Verifying a memory hit: do the request and the remembered one ask for the same thing? One token.
    verify_system: str
    verify_question: str  # {remembered}
    verify_yes: str
    verify_no: str

    def with_input(self, request: str) -> str:
        """The request framed as the model's input section."""
        return fill(self.input, {"input": request})


KOREAN = PromptLanguage(
    name="ko",
    section_separator="\n\n",
    input="<입력>\n{input}\n</입력>",
    list_item="- {item}",
    none_of_these="해당 없음",
    out_of_category="이 범주에 없음",
    judge_system="너는 분류기다. 반드시 라벨 하나만 출력한다.",
    judge_question="위 입력이 다음 중 어디에 해당하는가?\n{choices}\n라벨 하나만 답하라.",
    judge_none_choice="{symbol}. {none}",
    judge_choice="{symbol}. {label} — {description}",
    fallback_system="너는 업무 담당자다. 주어진 계약을 지켜 답한다.",
    path_scope="분류 경로: {path} (이 범위 안에서 답하라)",
    path_separator=" > ",
    examples="참고 예시:\n{examples}",
    complaint="직전 응답이 계약을 어겼다: {complaint}. 다시 답하라.",
    contract_text="자연스러운 한국어 문장으로 답하라.",
    contract_text_max="자연스러운 한국어 문장으로, {max_length}자 이내로 답하라.",
    contract_choice="다음 중 하나를 그대로 출력하라: {choices}",
    choice_separator=" / ",
    contract_score="{low}에서 {high} 사이의 정수 하나만 출력하라.",
    contract_tree="위 입력이 다음 중 어디에 해당하는가?\n{choices}\n이름 하나만 그대로 출력하라.",
    tree_choice_example=" (예: {description})",
    violation_empty="빈 응답",
    violation_not_integer="정수가 아니다 — 받은 값: '{value}'",
    violation_out_of_range="범위를 벗어났다 — 받은 값: {value}, 허용: {low}~{high}",
    violation_too_long="너무 길다 — {length}자, 최대 {max_length}자",
    violation_not_a_choice="보기에 없는 답이다 — 받은 값: '{value}'",
    instructions="다음 절차에 따라 답하라:\n{instructions}",
    slot_system="너는 답변 양식의 빈칸을 입력 내용으로 채운다. JSON 객체 하나만 출력한다.",
    slot_template="답변 양식:\n{template}",
    slot_question="아래 빈칸 이름을 키로, 채울 문자열을 값으로 하는 JSON 객체 하나만 출력하라:\n{blanks}",
    slot_blank='"{name}": {instruction}',
    blank_separator=", ",
    violation_not_json="JSON 객체 하나가 아니다 — 필요한 키: {names}",
    violation_missing_blanks="빠졌거나 비어 있는 칸이 있다 — {names}",
    verify_system="너는 두 요청이 같은 것을 묻는지 판단한다. 예 또는 아니오 한 단어만 출력한다.",
    verify_question=(
        "앞서 받은 다음 요청이 위 입력과 같은 것을 묻는가?\n<이전>\n{remembered}\n</이전>\n예 또는 아니오로만 답하라."
    ),
    verify_yes="예",
    verify_no="아니오",
)

ENGLISH = PromptLanguage(
    name="en",
    section_separator="\n\n",
    input="<request>\n{input}\n</request>",
    list_item="- {item}",
    none_of_these="None of these",
    out_of_category="Outside this category",
    judge_system="You are a classifier. Reply with exactly one label and nothing else.",
    judge_question="Which of these fits the request above?\n{choices}\nReply with one label only.",
    judge_none_choice="{symbol}. {none}",
    judge_choice="{symbol}. {label} — {description}",
    fallback_system="You answer requests for a support team. Follow the reply format you are given exactly.",
    path_scope="Category: {path} (answer within it)",
    path_separator=" > ",
    examples="Examples of good replies:\n{examples}",
    complaint="Your last reply broke the format: {complaint}. Try again.",
    contract_text="Reply in plain, natural sentences.",
    contract_text_max="Reply in plain, natural sentences, in at most {max_length} characters.",
    contract_choice="Reply with exactly one of: {choices}",
    choice_separator=" / ",
    contract_score="Reply with a single whole number from {low} to {high}.",
    contract_tree="Which of these answers fits the request above?\n{choices}\nCopy one of them exactly.",
    tree_choice_example=" (for example: {description})",
    violation_empty="the reply was empty",
    violation_not_integer="not a whole number (got '{value}')",
    violation_out_of_range="{value} is outside {low} to {high}",
    violation_too_long="{length} characters, more than {max_length}",
    violation_not_a_choice="'{value}' is not one of the choices",
    instructions="Follow these steps:\n{instructions}",
    slot_system="You fill in the blanks of a reply template from the request. Reply with one JSON object only.",
    slot_template="Reply template:\n{template}",
    slot_question="Reply with one JSON object whose keys are these blanks and whose values are strings:\n{blanks}",
    slot_blank='"{name}": {instruction}',
    blank_separator=", ",
    violation_not_json="not one JSON object (it needs the keys {names})",
    violation_missing_blanks="these blanks were missing or empty: {names}",
    verify_system=("You decide whether two customer requests ask for the same thing. Reply with one word, yes or no."),
    verify_question=(
        "Does this earlier request ask for the same thing as the request above?\n"
        "<earlier>\n{remembered}\n</earlier>\nReply with yes or no only."
    ),
    verify_yes="yes",
    verify_no="no",
)
