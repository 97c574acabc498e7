"""Checks a loaded tree: errors that make it unusable, and warnings that make the judge's job harder."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from gil_core.errors import LabelCapacityError, TreeFileError
from gil_core.ontology.model import Node, OptionKind, Tree

__all__ = ["LintFinding", "TreeLintWarning", "check_tree", "content_words", "lint_tree"]

_WORD = re.compile(r"[^\W\d_]{4,}", re.UNICODE)
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
# Function words carry no meaning of their own: sharing them says nothing about overlap.
_FUNCTION_WORDS = """
    about after also been before being both does each from have into more most only other over same some such
    than that their them then there these they this those through under very what when where which while will
    with would your
"""
# Framing verbs open many descriptions ("asks how ...", "wants ...") and say nothing about the topic.
_FRAMING_WORDS = "asks wants needs cannot"
_STOPWORDS = frozenset(_FUNCTION_WORDS.split()) | frozenset(_FRAMING_WORDS.split())


class TreeLintWarning(UserWarning):
    """A tree loads, but something in it will likely confuse the judge."""


@dataclass(frozen=True, slots=True)
class LintFinding:
    """One warning about a tree: where it is and what it says."""

    source: str | None
    line: int | None
    node: str
    message: str

    def __str__(self) -> str:
        where = self.source or "<tree>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: node {self.node!r}: {self.message}"


def check_tree(tree: Tree) -> list[LintFinding]:
    """Raise ``TreeFileError`` for a tree that cannot be used; warn (``TreeLintWarning``) and return findings."""
    _check_ids(tree)
    for node, _ in tree.iter_nodes():
        _check_capacity(tree, node)
        _check_templates(tree, node)
    findings = lint_tree(tree)
    for finding in findings:
        warnings.warn(str(finding), TreeLintWarning, stacklevel=3)
    return findings


def lint_tree(tree: Tree) -> list[LintFinding]:
    """Warnings only: siblings whose descriptions share a distinctive word are hard to tell apart.

    A word is distinctive when it is no function word and at most two descriptions in the whole tree use it.
    """
    groups = [
        [(c.id, c.description) for c in node.children] or [(o.id, o.description) for o in node.options]
        for node, _ in tree.iter_nodes()
    ]
    frequency: dict[str, int] = {}
    for siblings in groups:
        for _, description in siblings:
            for word in content_words(description):
                frequency[word] = frequency.get(word, 0) + 1
    findings: list[LintFinding] = []
    for (node, _), siblings in zip(tree.iter_nodes(), groups, strict=True):
        words = [(sibling_id, content_words(description)) for sibling_id, description in siblings]
        for index, (first_id, first_words) in enumerate(words):
            for second_id, second_words in words[index + 1 :]:
                shared = sorted(w for w in first_words & second_words if frequency[w] <= _DISTINCTIVE_AT_MOST)
                if shared:
                    message = f"the descriptions of {first_id!r} and {second_id!r} share {', '.join(shared)}"
                    findings.append(LintFinding(tree.source, node.line, node.id, message))
    return findings


_DISTINCTIVE_AT_MOST = 2


def content_words(text: str) -> set[str]:
    """The words of ``text`` that say what it is about: four letters or more, lower-cased, function words and
    the framing verbs of descriptions left out (also how ``gil_core.tree_draft`` names what it groups)."""
    return {word.lower() for word in _WORD.findall(text)} - _STOPWORDS


def _check_ids(tree: Tree) -> None:
    items = [(tree.root.id, tree.root.line)]
    for node, _ in tree.iter_nodes():
        items += [(child.id, child.line) for child in node.children]
        items += [(option.id, option.line) for option in node.options]
    # In file order, so the error points at the later of two equal ids.
    items.sort(key=lambda item: item[1] if item[1] is not None else 1 << 62)
    seen: dict[str, int | None] = {}
    for item_id, line in items:
        if item_id in seen:
            first = f" (first at line {seen[item_id]})" if seen[item_id] is not None else ""
            raise TreeFileError(f"duplicate id{first}", path=tree.source, line=line, node=item_id)
        seen[item_id] = line


def _check_capacity(tree: Tree, node: Node) -> None:
    count = len(node.children) or len(node.options)
    if count > node.label_scheme.capacity:
        raise LabelCapacityError(
            f"{count} candidates exceed the {node.label_scheme.value} scheme's capacity of "
            f"{node.label_scheme.capacity}; split the node or use another scheme",
            path=tree.source,
            line=node.line,
            node=node.id,
        )


def _check_templates(tree: Tree, node: Node) -> None:
    for option in node.options:
        if option.kind is not OptionKind.TEMPLATE or option.template is None:
            continue
        named = set(_PLACEHOLDER.findall(option.template))
        declared = {slot.name for slot in option.slots}
        if named != declared:
            missing = ", ".join(sorted(named - declared)) or "none"
            unused = ", ".join(sorted(declared - named)) or "none"
            raise TreeFileError(
                f"template blanks and slots differ (blanks without a slot: {missing}; slots not in the "
                f"template: {unused})",
                path=tree.source,
                line=option.line,
                node=option.id,
            )
