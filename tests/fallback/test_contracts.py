"""Each contract's instruction and validation, in both languages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gil_core.errors import ConfigurationError
from gil_core.fallback import (
    Accepted,
    ChoiceContract,
    Contract,
    ScoreContract,
    TextContract,
    TreeAnswerContract,
    Violation,
)
from gil_core.language import ENGLISH, KOREAN
from tests.fallback._support import small_tree

WHITE_SPACE = st.text(alphabet=" \t\n", max_size=3)


@given(st.text(min_size=1).filter(lambda text: text.strip() != ""), WHITE_SPACE, WHITE_SPACE)
def test_text_accepts_any_non_empty_reply_stripped(text: str, before: str, after: str) -> None:
    assert TextContract().validate(before + text + after, ENGLISH) == Accepted(text.strip())


@pytest.mark.parametrize("reply", ["", "   ", "\n\t"])
def test_text_rejects_an_empty_reply(reply: str) -> None:
    assert TextContract().validate(reply, KOREAN) == Violation("빈 응답")


def test_text_max_length_counts_code_points_not_bytes() -> None:
    contract = TextContract(max_length=3)
    assert contract.validate(" 환불됨 ", KOREAN) == Accepted("환불됨")
    assert contract.validate("환불완료", KOREAN) == Violation("너무 길다 — 4자, 최대 3자")
    assert contract.instruction(ENGLISH) == "Reply in plain, natural sentences, in at most 3 characters."


def test_choice_accepts_exactly_one_choice() -> None:
    contract = ChoiceContract(("yes", "no"))
    assert contract.validate(" no\n", ENGLISH) == Accepted("no")
    assert contract.validate("Yes", ENGLISH) == Violation("'Yes' is not one of the choices")
    assert contract.validate("maybe", KOREAN) == Violation("보기에 없는 답이다 — 받은 값: 'maybe'")
    assert contract.instruction(ENGLISH) == "Reply with exactly one of: yes / no"


@pytest.mark.parametrize("choices", [(), ("yes", " no"), ("",)])
def test_choice_needs_stripped_non_empty_choices(choices: tuple[str, ...]) -> None:
    with pytest.raises(ConfigurationError):
        ChoiceContract(choices)


@given(st.integers(-20, 20), st.integers(-10, 10), st.integers(0, 10), WHITE_SPACE)
def test_score_accepts_exactly_the_integers_in_range(value: int, low: int, width: int, pad: str) -> None:
    verdict = ScoreContract(low, low + width).validate(pad + str(value) + pad, ENGLISH)
    assert isinstance(verdict, Accepted) == (low <= value <= low + width)


@pytest.mark.parametrize("reply", ["x", "3.0", "1_0", "٣", "three", "3 4"])
def test_score_rejects_what_is_not_a_whole_number(reply: str) -> None:
    assert ScoreContract(1, 5).validate(reply, KOREAN) == Violation(f"정수가 아니다 — 받은 값: '{reply}'")


def test_score_names_the_range_it_missed() -> None:
    assert ScoreContract(1, 5).validate("7", KOREAN) == Violation("범위를 벗어났다 — 받은 값: 7, 허용: 1~5")
    with pytest.raises(ConfigurationError):
        ScoreContract(5, 1)


def test_tree_contract_lists_only_answer_habits_in_file_order_then_none_of_these() -> None:
    instruction = TreeAnswerContract(small_tree()).instruction(ENGLISH)
    assert instruction == (
        "Which of these answers fits the request above?\n"
        "- Refunds arrive within 5 business days. (for example: asks where a refund is)\n"
        "- We accept cards and bank transfer.\n"
        "- Items can be returned within 30 days. (for example: asks until when an item can be returned)\n"
        "- None of these\n"
        "Copy one of them exactly."
    )


def test_narrowed_tree_contract_lists_the_node_s_answers_and_escapes_out_of_category() -> None:
    contract = TreeAnswerContract(small_tree()).narrowed("returns")
    assert contract.scope == "returns" and contract.widened() == TreeAnswerContract(small_tree())
    assert [option.id for option in contract.answers()] == ["return-window"]
    assert contract.instruction(KOREAN).splitlines()[-2:] == ["- 이 범주에 없음", "이름 하나만 그대로 출력하라."]
    assert contract.escape(KOREAN) == KOREAN.out_of_category
    assert contract.is_escape(" 이 범주에 없음\n", KOREAN)
    assert not TreeAnswerContract(small_tree()).is_escape("이 범주에 없음", KOREAN)


def test_tree_contract_accepts_a_listed_text_or_its_escape_only() -> None:
    full = TreeAnswerContract(small_tree())
    narrowed = full.narrowed("returns")
    assert full.validate("We accept cards and bank transfer.\n", ENGLISH) == Accepted(
        "We accept cards and bank transfer."
    )
    assert full.validate("None of these", ENGLISH) == Accepted("None of these")
    assert narrowed.validate("We accept cards and bank transfer.", ENGLISH) == Violation(
        "'We accept cards and bank transfer.' is not one of the choices"
    )
    assert isinstance(narrowed.validate("None of these", ENGLISH), Violation)
    assert isinstance(full.validate("Outside this category", ENGLISH), Violation)


def test_tree_contract_cannot_narrow_to_an_unknown_node() -> None:
    with pytest.raises(ConfigurationError):
        TreeAnswerContract(small_tree()).narrowed("nowhere")


def test_every_contract_satisfies_the_protocol() -> None:
    contracts = [TextContract(), ChoiceContract(("a",)), ScoreContract(0, 1), TreeAnswerContract(small_tree())]
    assert all(isinstance(contract, Contract) for contract in contracts)
