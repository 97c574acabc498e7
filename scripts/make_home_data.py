"""Write the smart-home benchmark stream: data/home_requests.jsonl, data/home_answers.jsonl and ontologies/home.yaml.

    uv run --extra local python scripts/make_home_data.py [--out DIR] [--tree PATH]

The requests are expanded from the English sentence templates of the PyPI package ``home-assistant-intents``
(Apache-2.0) with ``hassil``: each template is sampled at random (one alternative per choice, one value per list),
never enumerated, so the stream is varied and small. Device, area, floor and free-text values (names, shopping
items, timer names...) are the made-up lists below; a ``{name}`` is drawn from the devices of the domain the
template requires. A text that two intents' templates produce is dropped from both: its label would be a coin toss.

The expected answer of a request is the name of the Home Assistant intent that handles it (``HassTurnOn``), as
the text of that intent's answer in the tree. The tree has two levels: categories by Home Assistant domain (the
generic ``homeassistant`` domain split into devices, timers, information and conversation; small related domains
merged), then one answer per intent.

Deterministic: a fixed seed, no clock, no environment; UTF-8 with ``\\n`` line ends. ``tests/test_home_data.py``
checks that a rerun gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from hassil import Intents
from hassil.expression import (
    Alternative,
    Expression,
    ListReference,
    Permutation,
    RuleReference,
    Sentence,
    Sequence,
    TextChunk,
)
from hassil.intents import IntentData, RangeSlotList, SlotList, TextSlotList, WildcardSlotList
from hassil.util import normalize_whitespace
from home_assistant_intents import get_intents

from gil_core.ontology import Node, Option, Tree, write_tree

ROOT = Path(__file__).resolve().parents[1]
SEED = 20261130
PER_INTENT = 32  # distinct requests wanted per intent; an intent with few templates yields fewer
MAX_DRAWS = 400  # samples tried per intent before settling for fewer distinct texts

# fmt: off
# Category id -> (description, ((intent, label, description), ...)). Labels and descriptions are ours: the
# package's one-line descriptions share words between siblings ("device or entity"), which confuses a judge.
CATEGORIES: dict[str, tuple[str, tuple[tuple[str, str, str], ...]]] = {
    "devices": ("switching devices on or off, opening or closing them, and asking what state they are in", (
        ("HassTurnOn", "turn on", "start, open, unlock or activate a device, scene or script"),
        ("HassTurnOff", "turn off", "shut down, close or lock it"),
        ("HassGetState", "get state", "ask whether something is on, closed or locked, or where a person is"),
        ("HassSetPosition", "set position", "move blinds, a cover or a valve to a percentage"),
    )),
    "lights-fans": ("brightness and color of lights, speed of fans", (
        ("HassLightSet", "set light", "change the brightness or the color of a light"),
        ("HassFanSetSpeed", "set fan speed", "set how fast a fan spins"),
    )),
    "climate": ("heating and cooling: thermostats and indoor temperature", (
        ("HassClimateSetTemperature", "set temperature", "set the heating or cooling to a number of degrees"),
        ("HassClimateGetTemperature", "get temperature", "ask how warm or cold it is indoors"),
        ("HassClimateSetFanMode", "set fan mode", "set the fan mode of a thermostat or air conditioner"),
    )),
    "media": ("music, television and speakers", (
        ("HassMediaPause", "pause media", "pause what is playing"),
        ("HassMediaUnpause", "resume media", "resume playback"),
        ("HassMediaNext", "next track", "skip ahead to the next track"),
        ("HassMediaPrevious", "previous track", "go back to the one before"),
        ("HassSetVolume", "set volume", "set how loud it plays, as a level"),
        ("HassSetVolumeRelative", "change volume", "turn the volume up or down a step"),
        ("HassMediaPlayerMute", "mute", "silence a speaker or television"),
        ("HassMediaPlayerUnmute", "unmute", "bring the sound back"),
        ("HassMediaSearchAndPlay", "play media", "find a song, album, artist or show and play it"),
    )),
    "timers": ("kitchen timers: starting, changing and checking them", (
        ("HassStartTimer", "start timer", "start a timer for a duration"),
        ("HassCancelTimer", "cancel timer", "stop one timer"),
        ("HassCancelAllTimers", "cancel all timers", "end every timer at once"),
        ("HassIncreaseTimer", "add time", "add minutes or seconds to a timer"),
        ("HassDecreaseTimer", "remove time", "take time off a timer"),
        ("HassPauseTimer", "pause timer", "pause a running timer"),
        ("HassUnpauseTimer", "resume timer", "continue a paused timer"),
        ("HassTimerStatus", "timer status", "ask how much time is left"),
    )),
    "lists": ("shopping and to-do lists", (
        ("HassShoppingListAddItem", "add to shopping list", "put an item on the shopping list"),
        ("HassShoppingListCompleteItem", "check off shopping item", "mark a shopping list item as bought"),
        ("HassListAddItem", "add to a list", "put an item on a named to-do list"),
        ("HassListCompleteItem", "complete list item", "tick off an item of a named to-do list as done"),
        ("HassListRemoveItem", "remove list item", "delete an item from a named to-do list"),
    )),
    "cleaning": ("robot vacuums and lawn mowers", (
        ("HassVacuumStart", "start vacuum", "start the robot vacuum"),
        ("HassVacuumReturnToBase", "vacuum to base", "send the robot vacuum back to its base"),
        ("HassVacuumCleanArea", "vacuum a room", "send the robot vacuum to clean one room"),
        ("HassLawnMowerStartMowing", "start mowing", "start cutting the grass"),
        ("HassLawnMowerDock", "dock mower", "send the lawn mower back to its dock"),
    )),
    "information": ("the weather, the date and the time", (
        ("HassGetWeather", "weather", "ask about the weather outside"),
        ("HassGetCurrentDate", "date", "ask what day or date it is"),
        ("HassGetCurrentTime", "time", "ask what time it is"),
    )),
    "conversation": ("talking to the assistant itself, or through it to the house", (
        ("HassBroadcast", "broadcast", "announce a message on every speaker"),
        ("HassNevermind", "never mind", "cancel the request, do nothing"),
        ("HassRespond", "chat", "small talk and questions about the assistant"),
    )),
}

# Made-up values for the lists the package leaves to each home: devices by domain, areas, floors, free text.
DEVICES: dict[str, tuple[str, ...]] = {
    "light": ("kitchen light", "desk lamp", "porch light", "ceiling light", "floor lamp", "bedside lamp"),
    "switch": ("coffee maker", "christmas tree", "pool pump", "space heater"),
    "fan": ("ceiling fan", "bedroom fan", "attic fan"),
    "cover": ("garage door", "living room blinds", "bedroom curtains", "patio awning"),
    "lock": ("front door lock", "back door", "side gate"),
    "valve": ("water main", "garden sprinkler valve"),
    "climate": ("thermostat", "heat pump", "upstairs air conditioner"),
    "media_player": ("living room tv", "kitchen speaker", "bedroom tv", "office speaker"),
    "sensor": ("outside temperature", "kitchen humidity", "power usage", "bedroom temperature"),
    "binary_sensor": ("front door sensor", "garage window", "hallway motion sensor"),
    "person": ("Jane", "Sam", "Alex"),
    "scene": ("movie night", "mood lighting", "good morning"),
    "script": ("party time", "bedtime routine"),
    "button": ("doorbell", "restart router"),
    "input_button": ("doorbell chime",),
    "input_boolean": ("guest mode", "vacation mode"),
    "vacuum": ("robot vacuum", "roomba"),
    "lawn_mower": ("lawn mower", "mower"),
    "todo": ("grocery list", "chores list", "packing list"),
    "weather": ("home", "forecast"),
}
AREAS = ("kitchen", "living room", "bedroom", "office", "garage", "hallway", "bathroom", "basement")
FLOORS = ("first floor", "second floor", "ground floor", "upstairs", "downstairs")
WILDCARDS: dict[str, tuple[str, ...]] = {
    "message": ("dinner is ready", "time to leave for school", "the movie starts in five minutes",
                "please come downstairs"),
    "search_query": ("jazz for dinner", "the latest episode of the news", "Taylor Swift", "lofi beats",
                     "the Beatles"),
    "zone": ("home", "work", "school", "the gym"),
    "timer_name": ("pasta", "pizza", "laundry", "tea"),
    "timer_command": ("turn off the oven", "open the windows", "feed the cat"),
    "shopping_list_item": ("milk", "eggs", "coffee filters", "bananas", "dish soap"),
    "todo_list_item": ("call the plumber", "water the plants", "pack sunscreen", "renew the passport"),
}
# fmt: on


class Request(NamedTuple):
    text: str
    intent: str
    category: str


def build_tree() -> Tree:
    """The two-level home tree: categories by domain, one answer per intent whose text is the intent name."""
    children = tuple(
        Node(
            category,
            description=description,
            options=tuple(
                Option(_option_id(intent), label=label, description=what, text=intent)
                for intent, label, what in intents
            ),
        )
        for category, (description, intents) in CATEGORIES.items()
    )
    return Tree(Node("root", children=children))


def _option_id(intent: str) -> str:
    """``HassTurnOn`` -> ``turn-on``."""
    name = intent.removeprefix("Hass")
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in name).lstrip("-")


def slot_lists() -> dict[str, SlotList]:
    """Our values for the lists the package leaves open (areas, floors, free text); names are drawn per domain."""
    lists: dict[str, SlotList] = {
        "area": TextSlotList.from_strings(AREAS),
        "floor": TextSlotList.from_strings(FLOORS),
    }
    lists.update({name: TextSlotList.from_strings(values) for name, values in WILDCARDS.items()})
    return lists


class Sampler:
    """Draws one random text from a hassil template: one branch per alternative, one value per list."""

    def __init__(self, rng: random.Random, lists: Mapping[str, SlotList], rules: Mapping[str, Sentence]) -> None:
        self.rng, self.lists, self.rules = rng, lists, rules

    def text(self, expression: Expression, names: tuple[str, ...]) -> str:
        return normalize_whitespace("".join(self._parts(expression, names))).strip()

    def _parts(self, expression: Expression, names: tuple[str, ...]) -> Iterator[str]:
        if isinstance(expression, TextChunk):
            yield expression.original_text
        elif isinstance(expression, Alternative):
            yield from self._parts(self.rng.choice(expression.items), names)
        elif isinstance(expression, Permutation):
            items = list(expression.items)
            self.rng.shuffle(items)
            for item in items:
                yield from self._parts(item, names)
        elif isinstance(expression, Sequence):
            for item in expression.items:
                yield from self._parts(item, names)
        elif isinstance(expression, RuleReference):
            yield from self._parts(self.rules[expression.rule_name].expression, names)
        elif isinstance(expression, ListReference):
            yield self._value(expression.list_name, names)
        else:  # pragma: no cover - hassil has no other expression types
            raise TypeError(f"unexpected hassil expression {expression!r}")

    def _value(self, list_name: str, names: tuple[str, ...]) -> str:
        if list_name == "name":
            return self.rng.choice(names)
        slot_list = self.lists[list_name]
        if isinstance(slot_list, RangeSlotList):
            return str(self.rng.choice(list(slot_list.get_numbers())))
        if isinstance(slot_list, TextSlotList):
            value = self.rng.choice(slot_list.values)
            return "".join(self._parts(value.text_in, names))
        if isinstance(slot_list, WildcardSlotList):  # pragma: no cover - every wildcard has values above
            raise KeyError(f"no values for the wildcard list {{{list_name}}}")
        raise TypeError(f"unexpected slot list {slot_list!r}")  # pragma: no cover


def _device_names(data: IntentData) -> tuple[str, ...]:
    """Devices of the domains a template requires (every device when it names none)."""
    domains = data.requires_context.get("domain") or list(DEVICES)
    domains = [domains] if isinstance(domains, str) else domains
    return tuple(name for domain in domains for name in DEVICES.get(domain, ()))


def sample_requests(intents: Intents, rng: random.Random) -> tuple[list[Request], int]:
    """Up to ``PER_INTENT`` distinct texts per intent of the tree, minus texts that two intents produce (the
    second value: how many texts were dropped so)."""
    lists = {**intents.slot_lists, **slot_lists()}
    category_of = {intent: category for category, (_, items) in CATEGORIES.items() for intent, _, _ in items}
    drawn: dict[str, list[str]] = {}
    for intent_name in category_of:
        templates = [(data, sentence) for data in intents.intents[intent_name].data for sentence in data.sentences]
        rng.shuffle(templates)  # every template once (in a seeded order) before any twice
        texts: list[str] = []
        for draw in range(MAX_DRAWS):
            if len(texts) >= PER_INTENT:
                break
            data, sentence = templates[draw % len(templates)]
            sampler = Sampler(rng, lists, {**intents.expansion_rules, **data.expansion_rules})
            text = sampler.text(sentence.expression, _device_names(data))
            if text and text not in texts:
                texts.append(text)
        drawn[intent_name] = texts
    owners = Counter(text for texts in drawn.values() for text in set(texts))
    requests = [
        Request(text, intent, category_of[intent])
        for intent, texts in drawn.items()
        for text in texts
        if owners[text] == 1
    ]
    rng.shuffle(requests)
    return requests, sum(len(texts) for texts in drawn.values()) - len(requests)


def build() -> tuple[Tree, list[Request], int]:
    """The tree, the requests, and how many sampled texts were dropped as claimed by two intents."""
    intents = Intents.from_dict(get_intents("en") or {})
    return (build_tree(), *sample_requests(intents, random.Random(SEED)))


def write(tree: Tree, requests: list[Request], out: Path, tree_path: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    width = len(str(len(requests)))
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for number, request in enumerate(requests, start=1):
        request_id = f"h{number:0{width}d}"
        rows["home_requests.jsonl"].append({"id": request_id, "text": request.text})
        answer = {"answer": request.intent, "option_id": _option_id(request.intent), "category": request.category}
        rows["home_answers.jsonl"].append({"id": request_id, **answer})
    for name, items in rows.items():
        with (out / name).open("w", encoding="utf-8", newline="\n") as handle:
            handle.writelines(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
    write_tree(tree, tree_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "data", help="output folder (default: data/)")
    parser.add_argument("--tree", type=Path, default=ROOT / "ontologies" / "home.yaml", help="where the tree goes")
    args = parser.parse_args()
    tree, requests, dropped = build()
    write(tree, requests, args.out, args.tree)
    per_intent = Counter(request.intent for request in requests)
    print(f"{len(requests)} requests over {len(per_intent)} intents -> {args.out}; tree -> {args.tree}")
    print(f"{dropped} sampled texts dropped: two intents produce them")
    for intent, count in sorted(per_intent.items(), key=lambda item: (item[1], item[0])):
        print(f"  {intent:<30} {count}")


if __name__ == "__main__":
    main()
