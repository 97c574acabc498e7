"""The request streams of the quality benchmark: what each one asks, what the answer key expects, and the
repeating version of each (Zipf-distributed repeats and paraphrases) that the memory arm runs on.

A stream is a list of ``Request``s (id, text, expected answer) plus the task file that answers it. Subsets are
drawn with a fixed seed, so every arm of a run, and every run, sees the same requests.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADLINES_CSV = ROOT.parent / "shared" / "data" / "headlines_test.csv"
SEED = 20261130
ZIPF_EXPONENT = 1.0
PARAPHRASE_SHARE = 0.5  # of the events that return to a request seen before; the rest repeat it verbatim


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a stream. ``option_id`` is the tree answer the key expects (None: none of them, or not
    known); ``kind`` is original, repeat or paraphrase (in a repeating stream)."""

    id: str
    text: str
    expected: str
    option_id: str | None = None
    kind: str = "original"


@dataclass(frozen=True)
class Stream:
    """A named stream: its requests, the task file that answers them, and how its paraphrases are worded."""

    name: str
    title: str
    task_file: Path
    requests: tuple[Request, ...]
    source: str
    wrappers: tuple[tuple[str, str], ...]  # (prefix, suffix) pairs a paraphrase may add

    def sample(self, count: int, *, salt: str = "") -> tuple[Request, ...]:
        """``count`` requests drawn with the benchmark's seed (all of them when ``count`` reaches the size)."""
        if count >= len(self.requests):
            return self.requests
        rng = random.Random(f"{SEED}/{self.name}/{salt}")
        return tuple(rng.sample(self.requests, count))


class StreamMissingError(FileNotFoundError):
    """A stream's input file is not where the benchmark looks for it; the message says where."""


# -- the three streams ----------------------------------------------------------------------------------------

CHAT_WRAPPERS = (
    ("Hi, ", ""),
    ("", " please"),
    ("Hello! ", " Thanks."),
    ("Sorry to ask again. ", ""),
    ("", " thank you"),
    ("Quick one: ", ""),
)
HEADLINE_OPTIONS = {"up": "up", "down": "down", "neutral": "neutral", "none": "no-move"}  # ontologies/headlines.yaml
HEADLINE_WRAPPERS = (
    ("", " - report"),
    ("UPDATE 1-", ""),
    ("", " (Reuters)"),
    ("BRIEF-", ""),
    ("", " | markets"),
)


def _read_jsonl(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        raise StreamMissingError(f"{path}: no such file")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
    return rows


def _keyed_stream(name: str, requests_file: str, answers_file: str) -> tuple[Request, ...]:
    """Requests joined with their answer key by id (both JSONL files under data/)."""
    texts = _read_jsonl(ROOT / "data" / requests_file)
    key = {str(row["id"]): row for row in _read_jsonl(ROOT / "data" / answers_file)}
    missing = [str(row["id"]) for row in texts if str(row["id"]) not in key]
    if missing:
        raise ValueError(f"data/{answers_file}: no answer for {name} request {missing[0]!r}")
    return tuple(
        Request(str(row["id"]), str(row["text"]), str(answer["answer"]), _optional(answer.get("option_id")))
        for row in texts
        for answer in (key[str(row["id"])],)
    )


def _optional(value: object) -> str | None:
    return None if value is None else str(value)


def _bundled_stream(name: str, title: str, files: tuple[str, str], source: str) -> Stream:
    """A stream whose requests and answer key live under data/, answered by ontologies/<name>-task.yaml."""
    task_file = ROOT / "ontologies" / f"{name}-task.yaml"
    return Stream(name, title, task_file, _keyed_stream(name, *files), source, CHAT_WRAPPERS)


def support_stream() -> Stream:
    files = ("support_tickets.jsonl", "support_answers.jsonl")
    return _bundled_stream("support", "Support tickets", files, "data/support_tickets.jsonl + answers (300 tickets)")


def home_stream() -> Stream:
    files = ("home_requests.jsonl", "home_answers.jsonl")
    source = "data/home_requests.jsonl + answers (scripts/make_home_data.py)"
    return _bundled_stream("home", "Smart home (Home Assistant intents)", files, source)


def headlines_stream(path: Path = HEADLINES_CSV) -> Stream:
    """The gold headlines: a CSV without header, ``"Q: <headline>\\nA:", label, id`` per row."""
    if not path.is_file():
        raise StreamMissingError(f"{path}: no such file (the headlines stream reads ../shared/data/)")
    requests = []
    with path.open(encoding="utf-8", newline="") as handle:
        for number, row in enumerate(csv.reader(handle), start=1):
            if len(row) != 3:
                raise ValueError(f"{path}:{number}: expected 3 columns (question, label, id), got {len(row)}")
            question, label, row_id = row
            text = question.removeprefix("Q:").strip().removesuffix("A:").strip()
            requests.append(Request(f"n{row_id}", text, label, HEADLINE_OPTIONS.get(label)))
    return Stream(
        "headlines",
        "Gold headlines (FrugalGPT HEADLINES)",
        ROOT / "ontologies" / "headlines-task.yaml",
        tuple(requests),
        f"../shared/data/{path.name} ({len(requests)} headlines)",
        HEADLINE_WRAPPERS,
    )


STREAMS: dict[str, Callable[[], Stream]] = {
    "support": support_stream,
    "home": home_stream,
    "headlines": headlines_stream,
}


# -- the repeating stream -------------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z]{5,}")


def paraphrase(text: str, rng: random.Random, wrappers: Sequence[tuple[str, str]]) -> str:
    """A mechanical rewording that keeps the meaning: a greeting or closing (the stream's wrappers), a case
    change, a typo (two letters swapped), or two of these. Never returns ``text`` itself."""
    edits: list[Callable[[str], str]] = [
        lambda t: _wrap(t, rng.choice(wrappers)),
        lambda t: t.lower() if t != t.lower() else t[:1].upper() + t[1:],
        lambda t: _swap_letters(t, rng),
    ]
    chosen = rng.sample(edits, rng.choice((1, 1, 2)))
    result = text
    for edit in chosen:
        result = edit(result)
    return result if result != text else _wrap(text, wrappers[0])


def _wrap(text: str, wrapper: tuple[str, str]) -> str:
    prefix, suffix = wrapper
    return f"{prefix}{text}{suffix}"


def _swap_letters(text: str, rng: random.Random) -> str:
    words = list(_WORD.finditer(text))
    if not words:
        return text
    word = rng.choice(words)
    at = rng.randrange(word.start() + 1, word.end() - 2)
    return text[:at] + text[at + 1] + text[at] + text[at + 2 :]


def repeating_stream(stream: Stream, bases: Sequence[Request], events: int) -> tuple[Request, ...]:
    """``events`` requests over ``bases``: each event picks a base with Zipf weights (rank r: 1/r^s, ranks in a
    seeded order); its first appearance is the base itself, a later one a verbatim repeat or (with probability
    ``PARAPHRASE_SHARE``) a paraphrase. Ids are ``<base id>#<event number>``."""
    rng = random.Random(f"{SEED}/{stream.name}/repeating")
    ranked = list(bases)
    rng.shuffle(ranked)
    weights = [1.0 / (rank**ZIPF_EXPONENT) for rank in range(1, len(ranked) + 1)]
    seen: set[str] = set()
    out = []
    for number, base in enumerate(rng.choices(ranked, weights=weights, k=events), start=1):
        if base.id not in seen:
            seen.add(base.id)
            text, kind = base.text, "original"
        elif rng.random() < PARAPHRASE_SHARE:
            text, kind = paraphrase(base.text, rng, stream.wrappers), "paraphrase"
        else:
            text, kind = base.text, "repeat"
        out.append(replace(base, id=f"{base.id}#{number}", text=text, kind=kind))
    return tuple(out)
