"""Taking secrets out of text before it reaches a message, a log line or a table: every whole secret, then every
run of ``FRAGMENT`` or more characters of one (what is left of a key that a server, a proxy or a library already
cut in half). Callers redact the whole text first and cut it short afterwards, never the other way round."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["FRAGMENT", "REDACTED", "redact_secrets"]

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
