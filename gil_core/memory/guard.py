"""A guard in front of memory hits: refuse to serve a remembered answer when the request and the remembered
request differ in a negation, a cancellation, a number or an amount.

Why: sentence embeddings barely see these words. "cancel my order" and "don't cancel my order", or "refund
within 7 days" and "refund within 7 weeks", land close enough to pass any useful threshold, and a false hit
serves a wrong answer with full confidence. A refused hit costs only a walk through the tree, so the guard is
deliberately strict: it compares what each text says (is a negation there at all, the set of numbers, the set of
amounts with their unit) and refuses on any difference. English and Korean are covered.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, replace
from decimal import Decimal

from gil_core.memory.ports import Recall

__all__ = ["GuardVerdict", "HitGuard", "has_negation"]

# A marker counts as present or absent; two texts that both negate ("No, I don't want…" / "I don't want…")
# agree. ``(?<![가-힣])`` keeps a Korean marker to the start of a word, where it negates.
_NEGATION = re.compile(
    r"\b(?:not|never|none|nothing|nobody|nowhere|neither|nor|without|cannot|"
    r"dont|doesnt|didnt|cant|wont|isnt|arent|wasnt|werent|havent|hasnt|hadnt|shouldnt|wouldnt|couldnt|mustnt)\b"
    r"|\b\w+n't\b"
    r"|\bno\b(?!\.?\s*\d)"  # "no" but not "No. 5"
    r"|않|없"  # 않다, 없다: only ever negate
    r"|(?<![가-힣])못"  # 못 해요, 못받았어요
    r"|(?<![가-힣])안(?=\s|$|[돼되해했하가갔와왔오올먹보봤받줘주될됐됨들써쓰열켜])"  # 안 돼, 안했어요; not 안내, 안전
    r"|지\s*(?:마|말)"  # 하지 마세요, 취소하지 말아 주세요
    r"|(?<![가-힣])아(?:니|닌|님|냐)"  # 아니요, 아닌데
)
_CANCELLATION = re.compile(
    r"\b(?:cancel\w*|undo\w*|revok\w*|unsubscrib\w*|withdr[ae]w\w*)\b|취소|해지|철회",
)

_WORD_NUMBERS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}  # fmt: skip
_MULTIPLIERS = {"천": 1_000, "만": 10_000, "억": 100_000_000, "thousand": 1_000, "million": 1_000_000}
_UNITS = {
    # currencies
    "$": "USD", "usd": "USD", "dollar": "USD", "dollars": "USD", "bucks": "USD", "달러": "USD", "불": "USD",
    "₩": "KRW", "krw": "KRW", "won": "KRW", "원": "KRW",
    "€": "EUR", "eur": "EUR", "euro": "EUR", "euros": "EUR", "유로": "EUR",
    "£": "GBP", "gbp": "GBP", "pound": "GBP", "pounds": "GBP", "파운드": "GBP",
    "¥": "JPY", "jpy": "JPY", "yen": "JPY", "엔": "JPY",
    # shares, weights, durations
    "%": "%", "percent": "%", "퍼센트": "%", "프로": "%",
    "kg": "kg", "킬로": "kg", "lb": "lb", "lbs": "lb",
    "minute": "minute", "minutes": "minute", "분": "minute",
    "hour": "hour", "hours": "hour", "시간": "hour",
    "day": "day", "days": "day", "일": "day",
    "week": "week", "weeks": "week", "주일": "week",
    "month": "month", "months": "month", "개월": "month", "달": "month",
    "year": "year", "years": "year", "년": "year",
}  # fmt: skip
_NUMBER = r"(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
_MULTIPLIER = r"(?:\s*(?P<multiplier>천|만|억|thousand\b|million\b))?"


def _alternatives(units: Iterable[str]) -> str:
    return "|".join(sorted((re.escape(unit) for unit in units), key=len, reverse=True))


# A Latin unit may follow after a space; a Korean one only attached ("3일", "30,000원"): spaced, "주"/"일"/"분"
# start too many other words.
_LATIN_UNITS = _alternatives(unit for unit in _UNITS if unit.isascii() and unit != "$")
_KOREAN_UNITS = _alternatives(unit for unit in _UNITS if re.fullmatch(r"[가-힣]+", unit))
_UNIT = rf"(?:\s*(?P<unit>{_LATIN_UNITS})(?![a-z])|(?P<korean_unit>{_KOREAN_UNITS}))?"
_QUANTITY = re.compile(
    rf"(?P<prefix>[$₩€£¥])?\s*(?<![\d.,]){_NUMBER}{_MULTIPLIER}{_UNIT}"
    rf"|\b(?P<word>{'|'.join(_WORD_NUMBERS)})\b(?:\s+(?P<word_unit>{_LATIN_UNITS})(?![a-z]))?"
)


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """Whether a memory hit may be served; ``reason`` says why not (None when allowed)."""

    allowed: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class _Reading:
    """What the guard compares in one text."""

    negations: tuple[str, ...]
    cancellations: tuple[str, ...]
    numbers: frozenset[Decimal]
    amounts: frozenset[tuple[str, Decimal]]


class HitGuard:
    """Checks a memory hit: ``check(request, remembered)`` refuses when the texts differ in a negation, a
    cancellation, the set of numbers or the set of amounts (number with currency or unit)."""

    def screen(self, recall: Recall, request: str, *, private: bool = False) -> Recall:
        """``recall`` as it may be served for ``request``: a hit the guard refuses is a miss that says why (for a
        do-not-record request the kind of difference only: the reason quotes both requests' numbers and words)."""
        if not recall.hit or recall.text is None:
            return recall
        verdict = self.check(request, recall.text)
        if verdict.allowed:
            return recall
        reason = verdict.reason or ""
        return replace(recall, hit=False, refused=f"guard: {reason.split(':', 1)[0] if private else reason}")

    def check(self, request: str, remembered: str) -> GuardVerdict:
        """Whether the answer remembered for ``remembered`` may be served for ``request``."""
        asked, held = _read(request), _read(remembered)
        if bool(asked.negations) != bool(held.negations):
            return _refuse("negation differs", _markers(asked.negations), _markers(held.negations))
        if bool(asked.cancellations) != bool(held.cancellations):
            return _refuse("cancellation differs", _markers(asked.cancellations), _markers(held.cancellations))
        if asked.numbers != held.numbers:
            return _refuse("numbers differ", _numbers(asked.numbers), _numbers(held.numbers))
        if asked.amounts != held.amounts:
            return _refuse("amounts differ", _amounts(asked.amounts), _amounts(held.amounts))
        return GuardVerdict(allowed=True)


def has_negation(text: str) -> bool:
    """Whether ``text`` negates (English or Korean), by the markers the guard compares."""
    return _NEGATION.search(_normal(text)) is not None


def _normal(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower().replace("’", "'").replace("‘", "'")


def _read(text: str) -> _Reading:
    normal = _normal(text)
    numbers: set[Decimal] = set()
    amounts: set[tuple[str, Decimal]] = set()
    for match in _QUANTITY.finditer(normal):
        if match["word"] is not None:
            value, unit = Decimal(_WORD_NUMBERS[match["word"]]), match["word_unit"]
        else:
            value = Decimal(match["number"].replace(",", "")) * _MULTIPLIERS.get(match["multiplier"] or "", 1)
            unit = match["prefix"] or match["unit"] or match["korean_unit"]
        numbers.add(value)
        if unit is not None:
            amounts.add((_UNITS[unit], value))
    return _Reading(
        negations=tuple(match.group() for match in _NEGATION.finditer(normal)),
        cancellations=tuple(match.group() for match in _CANCELLATION.finditer(normal)),
        numbers=frozenset(numbers),
        amounts=frozenset(amounts),
    )


def _refuse(what: str, asked: str, held: str) -> GuardVerdict:
    return GuardVerdict(allowed=False, reason=f"{what}: request has {asked}, remembered request has {held}")


def _markers(found: Iterable[str]) -> str:
    words = [f"'{word.strip()}'" for word in dict.fromkeys(found)]
    return ", ".join(words) or "none"


def _numbers(values: Iterable[Decimal]) -> str:
    return "{" + ", ".join(sorted((_plain(value) for value in values), key=Decimal)) + "}"


def _amounts(values: Iterable[tuple[str, Decimal]]) -> str:
    return "{" + ", ".join(sorted(f"{_plain(value)} {unit}" for unit, value in values)) + "}"


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f")
