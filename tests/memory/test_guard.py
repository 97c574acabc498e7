"""HitGuard: a memory hit is refused when the request and the remembered request differ in a negation, a
cancellation, a number or an amount, in English and Korean, and allowed when they only differ in wording."""

from __future__ import annotations

import pytest

from gil_core.memory.guard import GuardVerdict, HitGuard

REFUSED = [
    # (request, remembered, the start of the reason)
    ("cancel my order", "don't cancel my order", "negation differs"),
    ("I can't log in", "I can log in", "negation differs"),
    ("I never got the parcel", "I got the parcel", "negation differs"),
    ("is there no fee?", "is there a fee?", "negation differs"),
    ("it does not work", "it works", "negation differs"),
    ("주문 취소해 주세요", "주문 취소하지 마세요", "negation differs"),
    ("배송이 안 돼요", "배송이 돼요", "negation differs"),
    ("결제가 안돼요", "결제가 돼요", "negation differs"),
    ("환불 받을 수 없나요", "환불 받을 수 있나요", "negation differs"),
    ("로그인이 되지 않아요", "로그인이 돼요", "negation differs"),
    ("택배를 못 받았어요", "택배를 받았어요", "negation differs"),
    ("cancel my subscription", "renew my subscription", "cancellation differs"),
    ("구독 해지하고 싶어요", "구독 연장하고 싶어요", "cancellation differs"),
    ("I ordered 2 shirts", "I ordered 3 shirts", "numbers differ"),
    ("order 1234 is late", "order 1235 is late", "numbers differ"),
    ("I want two tickets", "I want three tickets", "numbers differ"),
    ("3개 주문했어요", "5개 주문했어요", "numbers differ"),
    ("I was charged $5", "I was charged $50", "numbers differ"),
    ("I was charged $5", "I was charged €5", "amounts differ"),
    ("refund within 7 days", "refund within 7 weeks", "amounts differ"),
    ("5,000원 결제됐어요", "5,000달러 결제됐어요", "amounts differ"),
    ("a 10% discount", "a 10 dollar discount", "amounts differ"),
]

ALLOWED = [
    ("how do I reset my password", "how can I reset my password"),
    ("cancel my order please", "please cancel my order"),
    ("don't cancel my order", "please do not cancel my order"),
    ("No, I don't want a refund", "I don't want a refund"),
    ("I want two tickets", "I want 2 tickets"),
    ("I paid $5", "I paid 5 dollars"),
    ("I paid 1,000 won", "I paid 1000 KRW"),
    ("3만원 환불해 주세요", "30,000원 환불해 주세요"),
    ("안내 부탁드립니다", "안내 부탁해요"),  # 안내 (guidance) is not 안 (not)
    ("안전한가요?", "안전해요?"),  # nor is 안전 (safety)
    ("배송 조회는 어떻게 하나요", "배송 조회 방법 알려주세요"),
    ("where is item No. 5", "where is item no. 5"),
]


@pytest.mark.parametrize(("request_text", "remembered", "reason"), REFUSED)
def test_a_hit_is_refused_when_the_texts_differ_in_what_embeddings_miss(
    request_text: str, remembered: str, reason: str
) -> None:
    verdict = HitGuard().check(request_text, remembered)
    assert not verdict.allowed
    assert verdict.reason is not None and verdict.reason.startswith(reason)


@pytest.mark.parametrize(("request_text", "remembered"), [(r, m) for r, m, _ in REFUSED])
def test_refusal_does_not_depend_on_which_side_is_remembered(request_text: str, remembered: str) -> None:
    assert not HitGuard().check(remembered, request_text).allowed


@pytest.mark.parametrize(("request_text", "remembered"), ALLOWED)
def test_a_hit_is_allowed_when_only_the_wording_differs(request_text: str, remembered: str) -> None:
    assert HitGuard().check(request_text, remembered) == GuardVerdict(allowed=True, reason=None)


def test_the_reason_names_what_each_side_says() -> None:
    verdict = HitGuard().check("I was charged $5", "I was charged €5")
    assert verdict.reason == "amounts differ: request has {5 USD}, remembered request has {5 EUR}"
    verdict = HitGuard().check("cancel my order", "don't cancel my order")
    assert verdict.reason == "negation differs: request has none, remembered request has 'don't'"
