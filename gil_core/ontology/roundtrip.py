"""Editing a person's tree file in place (``gil review decide``): the change between two trees applied to the
file's round-trip YAML (``ruamel.yaml``), so that its comments, key order, quoting and indentation survive.

The file is read within the bounds of ``gil_core._config_yaml`` and parsed by the bounded loader first (size,
nesting, aliases expanded), so ``ruamel.yaml`` never sees an alias bomb; a file that no longer holds the tree the
change was computed from is refused. New entries are written by the compact writer and read back round-trip, so
they are quoted as ``dump_tree`` quotes them (NEL, U+0085, double-quoted; multi-line text a literal block); any
string holding a NEL is written double-quoted. The edited text is parsed again and must hold exactly the new
tree, or it is refused. The caller writes the text (atomically, ``gil_core.atomic``).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError as RoundTripYAMLError
from ruamel.yaml.representer import RoundTripRepresenter
from ruamel.yaml.scalarstring import (
    FoldedScalarString,
    LiteralScalarString,
    PlainScalarString,
    SingleQuotedScalarString,
)
from ruamel.yaml.util import load_yaml_guess_indent

from gil_core._config_yaml import YAMLLimitError, read_config_text
from gil_core.errors import TreeFileError
from gil_core.ontology.files import _compact_yaml, _node_data, _option_data, parse_tree
from gil_core.ontology.labels import LabelScheme
from gil_core.ontology.lint import TreeLintWarning
from gil_core.ontology.model import Node, Option, Tree

__all__ = ["edited_tree_text"]


class _Representer(RoundTripRepresenter):
    """Round-trip representer that writes any string holding a NEL (U+0085) double-quoted: YAML 1.1 readers
    (PyYAML, which reads tree files) take a NEL in a plain, single-quoted or block scalar as a line break."""


def _represent_text(representer: RoundTripRepresenter, value: str) -> Any:
    if "\x85" in value:
        return representer.represent_scalar("tag:yaml.org,2002:str", str(value), style='"')
    if isinstance(value, LiteralScalarString):
        return representer.represent_literal_scalarstring(value)
    if isinstance(value, FoldedScalarString):
        return representer.represent_folded_scalarstring(value)
    if isinstance(value, SingleQuotedScalarString):
        return representer.represent_single_quoted_scalarstring(value)
    if isinstance(value, PlainScalarString):
        return representer.represent_plain_scalarstring(value)
    return representer.represent_str(value)


for _type in (str, LiteralScalarString, FoldedScalarString, SingleQuotedScalarString, PlainScalarString):
    _Representer.add_representer(_type, _represent_text)


def _round_trip() -> YAML:
    handler = YAML(typ="rt")
    handler.Representer = _Representer
    handler.preserve_quotes = True
    handler.width = 1 << 30  # never fold a long line the person wrote on one
    return handler


def edited_tree_text(path: str | Path, before: Tree, after: Tree) -> str:
    """The text of the tree file at ``path`` with the change from ``before`` to ``after`` applied in place.

    Raises ``TreeFileError`` naming the file when it cannot be read, is past the bounds, no longer holds
    ``before``, or cannot take the change without changing more than it."""
    source = str(path)
    try:
        text = read_config_text(Path(path))
    except YAMLLimitError as exc:
        raise TreeFileError(exc.problem, path=source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TreeFileError(f"cannot read the tree file: {exc}", path=source) from exc
    current = _parsed(text, source)  # the bounded loader first: no alias bomb reaches ruamel.yaml
    if current.root != before.root:
        raise TreeFileError(
            "the tree file changed since the decision's tree was read from it; decide again", path=source
        )
    handler = _round_trip()
    try:
        document, indent, block_seq_indent = load_yaml_guess_indent(text, yaml=handler)
    except RoundTripYAMLError as exc:
        raise TreeFileError(f"cannot edit the tree file in place: {exc}", path=source) from exc
    if indent is not None:
        offset = block_seq_indent or 0
        handler.indent(mapping=max(indent - offset, 2), sequence=indent, offset=offset)
    if not isinstance(document, CommentedMap):
        raise TreeFileError("cannot edit the tree file in place: its root is not a mapping", path=source, line=1)
    _edit_node(document, before.root, after.root, LabelScheme.LETTERS, handler)
    stream = io.StringIO()
    handler.dump(document, stream)
    edited = stream.getvalue()
    if _parsed(edited, source).root != after.root:
        raise TreeFileError(
            "cannot edit the tree file in place: the edited file would not hold the decided tree", path=source
        )
    return edited


def _parsed(text: str, source: str) -> Tree:
    """The tree ``text`` holds, read as ``load_tree`` reads it; its lint warnings were given when it was loaded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return parse_tree(text, source=source)


def _fragment(data: dict[str, Any], handler: YAML) -> CommentedMap:
    """``data`` as the compact writer quotes it, read back round-trip."""
    loaded = handler.load(_compact_yaml([data]))
    entry: CommentedMap = loaded[0]
    return entry


def _edit_node(mapping: CommentedMap, before: Node, after: Node, inherited: LabelScheme, handler: YAML) -> None:
    wanted = _node_data(after, inherited)
    for key in ("label", "description", "label_scheme"):
        if getattr(before, key) != getattr(after, key):
            if key in wanted:
                mapping[key] = _fragment(wanted, handler)[key]
            else:
                mapping.pop(key, None)
    old_children = {child.id: child for child in before.children}
    _edit_list(
        mapping,
        "children",
        [child.id for child in after.children],
        lambda index: _node_data(after.children[index], after.label_scheme),
        handler,
    )
    for entry, child in zip(mapping.get("children") or [], after.children, strict=False):
        if child.id in old_children and old_children[child.id] != child:
            _edit_node(entry, old_children[child.id], child, after.label_scheme, handler)
    old_options = {option.id: option for option in before.options}
    _edit_list(
        mapping,
        "options",
        [option.id for option in after.options],
        lambda index: _option_data(after.options[index]),
        handler,
        changed=lambda index: _changed(old_options, after.options[index]),
    )


def _changed(old: dict[str, Option], option: Option) -> bool:
    return option.id in old and old[option.id] != option


def _edit_list(
    mapping: CommentedMap,
    key: str,
    ids: Sequence[str],
    data: Callable[[int], dict[str, Any]],
    handler: YAML,
    changed: Callable[[int], bool] | None = None,
) -> None:
    """Make ``mapping[key]`` list the entries ``ids`` in order: entries kept where they are (with their
    comments), the others removed, new ones inserted from ``data(index)``."""
    entries = mapping.get(key)
    if not isinstance(entries, CommentedSeq):
        if not ids:
            return
        entries = CommentedSeq()
        mapping[key] = entries
    wanted = set(ids)
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if not isinstance(entry, CommentedMap) or str(entry.get("id")) not in wanted:
            del entries[index]
    for index, item in enumerate(ids):
        present = index < len(entries) and str(entries[index].get("id")) == item
        if not present:
            entries.insert(index, _fragment(data(index), handler))
        elif changed is not None and changed(index):
            entries[index] = _fragment(data(index), handler)
    if not ids:
        del mapping[key]
