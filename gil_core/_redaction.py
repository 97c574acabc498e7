"""Taking secrets out of text before it reaches a message, a log line or a table: every whole secret, then every
run of ``FRAGMENT`` or more characters of one (what is left of a key that a server, a proxy or a library already
cut in half). Callers redact the whole text first and cut it short afterwards, never the other way round. A
do-not-record request is taken out of what is said about it by the same rule (``unquote``)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["FRAGMENT", "REDACTED", "redact_secrets", "unquote"]

REDACTED = "***"
FRAGMENT = 8
"""The shortest run of a secret's characters taken out on its own: shorter runs occur in ordinary text."""


def redact_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` and each run of at least ``FRAGMENT`` of their characters replaced by
    ``REDACTED``. Linear in the text's length (one set lookup per position)."""
    values = sorted({secret for secret in secrets if secret}, key=len, reverse=True)
    for value in values:
        text = text.replace(value, REDACTED)
    grams = {value[start : start + FRAGMENT] for value in values for start in range(len(value) - FRAGMENT + 1)}
    if not grams:
        return text
    pieces: list[str] = []
    kept = position = 0
    while position + FRAGMENT <= len(text):
        if text[position : position + FRAGMENT] not in grams:
            position += 1
            continue
        end = position + FRAGMENT
        while end < len(text) and text[end - FRAGMENT + 1 : end + 1] in grams:
            end += 1
        pieces += [text[kept:position], REDACTED]
        kept = position = end
    pieces.append(text[kept:])
    return "".join(pieces)


def unquote(message: str, text: str) -> str:
    """``message`` with every run of at least ``FRAGMENT`` characters of ``text`` replaced by ``REDACTED`` (a text
    shorter than that, where it appears whole): what an exception or a server says about a do-not-record request
    may quote it, whole or cut short. Linear in both lengths; the memory it takes is bounded by the message's."""
    if len(text) < FRAGMENT:
        return message.replace(text, REDACTED) if text.strip() else message
    run = FRAGMENT
    grams = {message[start : start + run] for start in range(len(message) - run + 1)}
    quoted = {gram for start in range(len(text) - run + 1) if (gram := text[start : start + run]) in grams}
    hidden = [False] * len(message)
    for start in range(len(message) - run + 1):
        if message[start : start + run] in quoted:
            hidden[start : start + run] = [True] * run
    pieces = [
        REDACTED if hide else char
        for index, (char, hide) in enumerate(zip(message, hidden, strict=True))
        if not (hide and index and hidden[index - 1])  # one mask per hidden run
    ]
    return "".join(pieces)
