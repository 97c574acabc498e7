"""The tree of categories and answers: immutable value objects and the look-ups traversal needs."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from gil_core.ontology.labels import LabelScheme

__all__ = ["Node", "Option", "OptionKind", "Origin", "Slot", "Tree", "version_option"]


class OptionKind(StrEnum):
    """What an option yields when the tree reaches it."""

    ANSWER = "answer"
    TEMPLATE = "template"
    PROCEDURE = "procedure"


class Origin(StrEnum):
    """Who put an option into the tree: a person (seed) or a review round (promoted)."""

    SEED = "seed"
    PROMOTED = "promoted"


FIXED_INSTRUCTION = "fixed"


@dataclass(frozen=True, slots=True)
class Slot:
    """A blank in a template. A slot whose instruction is the word ``fixed`` takes ``fixed`` and is never asked;
    a slot with a ``pattern`` (a Python regular expression) takes its first match in the request, and is asked
    only when there is none."""

    name: str
    instruction: str
    fixed: str | None = None
    pattern: str | None = None

    @property
    def is_fixed(self) -> bool:
        return self.instruction == FIXED_INSTRUCTION

    def pattern_problem(self) -> str | None:
        """Why ``pattern`` cannot fill this slot (None when it can, or when there is no pattern)."""
        if self.pattern is None:
            return None
        if self.is_fixed:
            return "a fixed slot takes no 'pattern'"
        try:
            compiled = re.compile(self.pattern)
        except (re.error, OverflowError, RecursionError) as exc:  # the last two: huge counts, deep nesting
            return f"'pattern' is no valid regular expression: {exc}"
        if compiled.groups > 1:
            return f"'pattern' has {compiled.groups} capturing groups: one at most (its text fills the slot)"
        # Such a pattern's first match is usually the empty one at the start of the request, which says nothing:
        # it is almost always a mistake for one that needs some characters (``\d*`` for ``\d+``).
        if compiled.search("") is not None:
            return "'pattern' matches the empty string"
        return None


@dataclass(frozen=True, slots=True)
class Option:
    """A habit: an answer text, a template with slots, or a procedure's steps."""

    id: str
    kind: OptionKind = OptionKind.ANSWER
    label: str = ""
    description: str = ""
    text: str | None = None
    template: str | None = None
    slots: tuple[Slot, ...] = ()
    steps: str | None = None
    origin: Origin = Origin.SEED
    line: int | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.id)

    @property
    def answer_version(self) -> str:
        """The option's id and a digest of what it answers with (its kind, text, template, slots and steps; not its
        label or description, which change what the judge is shown, not the answer): ``"refund#3fa2c1d0e9b7"``.
        A verdict records it for the answer it confirmed, so memory can tell an answer the tree has changed since
        (``Tree.answer_versions``)."""
        what = [
            self.kind.value,
            self.text,
            self.template,
            [list(_slot_fields(slot)) for slot in self.slots],
            self.steps,
        ]
        digest = hashlib.sha256(json.dumps(what, ensure_ascii=False).encode()).hexdigest()
        return f"{self.id}#{digest[:12]}"


def version_option(version: str) -> str:
    """The id of the option an ``Option.answer_version`` names."""
    return version.rpartition("#")[0]


def _slot_fields(slot: Slot) -> tuple[str, str, str | None, str | None]:
    return slot.name, slot.instruction, slot.fixed, slot.pattern


@dataclass(frozen=True, slots=True)
class Node:
    """A category. It has children or options, never both; ``label_scheme`` is already inherited."""

    id: str
    label: str = ""
    description: str = ""
    label_scheme: LabelScheme = LabelScheme.LETTERS
    children: tuple[Node, ...] = ()
    options: tuple[Option, ...] = ()
    line: int | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.id)

    @property
    def is_leaf(self) -> bool:
        """A node without children: its candidates are its options (habits)."""
        return not self.children


@dataclass(frozen=True)
class Tree:
    """A whole tree with id look-ups. ``source`` names the file it came from, for messages."""

    root: Node
    source: str | None = None

    def iter_nodes(self) -> Iterator[tuple[Node, int]]:
        """Every node with its layer (root = 1), depth first, in file order."""
        stack: list[tuple[Node, int]] = [(self.root, 1)]
        while stack:
            node, layer = stack.pop()
            yield node, layer
            stack.extend((child, layer + 1) for child in reversed(node.children))

    @cached_property
    def _index(self) -> dict[str, tuple[Node, Node | None]]:
        index: dict[str, tuple[Node, Node | None]] = {self.root.id: (self.root, None)}
        for node, _ in self.iter_nodes():
            for child in node.children:
                index[child.id] = (child, node)
        return index

    @cached_property
    def _options(self) -> dict[str, tuple[Option, Node]]:
        return {option.id: (option, node) for node, _ in self.iter_nodes() for option in node.options}

    @cached_property
    def answer_versions(self) -> frozenset[str]:
        """Every option's ``Option.answer_version``: the answers this tree gives, as verdicts record them."""
        return frozenset(option.answer_version for option, _ in self.options())

    def node(self, node_id: str) -> Node:
        """The node with this id; ``KeyError`` when there is none."""
        return self._index[node_id][0]

    def has_node(self, node_id: str) -> bool:
        return node_id in self._index

    def option(self, option_id: str) -> Option:
        """The option with this id; ``KeyError`` when there is none."""
        return self._options[option_id][0]

    def has_option(self, option_id: str) -> bool:
        return option_id in self._options

    def owner(self, option_id: str) -> Node:
        """The node an option hangs under."""
        return self._options[option_id][1]

    def parent(self, node_id: str) -> Node | None:
        """The parent of a node (None for the root)."""
        return self._index[node_id][1]

    def path_to(self, node_id: str) -> tuple[Node, ...]:
        """The nodes from the root down to ``node_id``, both included."""
        path: list[Node] = []
        current: Node | None = self.node(node_id)
        while current is not None:
            path.append(current)
            current = self.parent(current.id)
        return tuple(reversed(path))

    def options(self) -> Iterator[tuple[Option, Node]]:
        """Every option with the node it hangs under, in file order."""
        for node, _ in self.iter_nodes():
            for option in node.options:
                yield option, node
