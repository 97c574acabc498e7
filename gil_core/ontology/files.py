"""Read and write tree files. The writer's compact form omits every field equal to its default, so a tree
written back diffs cleanly against the file a person wrote; the reader names file, line and node in each error."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from gil_core._config_yaml import BoundedLoader, YAMLLimitError, misspelt, read_config_text
from gil_core.atomic import atomic_write_text
from gil_core.errors import TreeFileError
from gil_core.ontology.labels import LabelScheme
from gil_core.ontology.lint import check_tree
from gil_core.ontology.model import FIXED_INSTRUCTION, Node, Option, OptionKind, Origin, Slot, Tree

__all__ = ["dump_tree", "load_tree", "parse_tree", "write_tree"]

_NODE_KEYS = ("id", "label", "description", "label_scheme", "children", "options")
_OPTION_KEYS = ("id", "kind", "label", "description", "text", "template", "slots", "steps", "origin")
_SLOT_KEYS = ("name", "instruction", "fixed", "pattern")
_ID_LINE = re.compile(r"^\s*(?:-\s+)?id:\s*['\"]?([^'\"#\s]+)")


def load_tree(path: str | Path) -> Tree:
    """Read a tree file. Raises ``TreeFileError`` naming ``path:line`` and the node on any problem, a file past
    the bounds of ``gil_core._config_yaml`` (size, nesting, aliases expanded) included."""
    path = Path(path)
    try:
        text = read_config_text(path)
    except YAMLLimitError as exc:
        raise TreeFileError(exc.problem, path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TreeFileError(f"cannot read the tree file: {exc}", path=str(path)) from exc
    return parse_tree(text, source=str(path))


def parse_tree(text: str, *, source: str = "<tree>") -> Tree:
    """Parse tree YAML held in a string; ``source`` is the name used in messages."""
    loader = BoundedLoader(text)
    try:
        document = loader.get_single_node()
    except YAMLLimitError as exc:
        raise TreeFileError(exc.problem, path=source, line=exc.line) from None
    except yaml.MarkedYAMLError as exc:
        # The context mark is where the broken construct began (an unclosed quote, say); the problem mark
        # is where the parser gave up, often much later.
        mark = exc.context_mark or exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        node = _enclosing_id(text, line) if line is not None else None
        detail = f"{exc.context}, {exc.problem}" if exc.context else str(exc.problem)
        if exc.context_mark is not None and exc.problem_mark is not None:
            detail += f" (at line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1})"
        raise TreeFileError(f"YAML syntax error: {detail}", path=source, line=line, node=node) from exc
    except yaml.YAMLError as exc:
        raise TreeFileError(f"YAML error: {exc}", path=source) from exc
    finally:
        loader.dispose()
    if document is None:
        raise TreeFileError("the file holds no tree", path=source, line=1)
    if isinstance(document, yaml.MappingNode):  # a task file handed over for its tree: say which file to give
        keys = {key.value for key, _ in document.value if isinstance(key, yaml.ScalarNode)}
        if {"task", "tree"} <= keys:
            raise TreeFileError("a task file, not a tree file: its tree is the file its 'tree' names", path=source)
    reader = _Reader(source, loader)
    root = reader.node(document, LabelScheme.LETTERS)
    tree = Tree(root=root, source=source)
    check_tree(tree)
    return tree


def _enclosing_id(text: str, line: int) -> str | None:
    """The id of the last node or option declared at or above ``line``: where a syntax error sits."""
    lines = text.splitlines()
    for number in range(min(line, len(lines)), 0, -1):
        match = _ID_LINE.match(lines[number - 1])
        if match:
            return match.group(1)
    return None


class _Reader:
    """Walks the composed YAML graph so that every value keeps its line."""

    def __init__(self, source: str, loader: yaml.SafeLoader) -> None:
        self.source = source
        self.loader = loader

    def fail(self, message: str, yaml_node: yaml.Node, owner: str | None) -> TreeFileError:
        return TreeFileError(message, path=self.source, line=yaml_node.start_mark.line + 1, node=owner)

    def mapping(
        self, yaml_node: yaml.Node, allowed: tuple[str, ...], what: str, owner: str | None
    ) -> dict[str, yaml.Node]:
        if not isinstance(yaml_node, yaml.MappingNode):
            raise self.fail(f"{what} must be a mapping of keys to values", yaml_node, owner)
        fields: dict[str, yaml.Node] = {}
        for key_node, value_node in yaml_node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key not in allowed:
                known = ", ".join(allowed)
                hint = misspelt(key, allowed)
                raise self.fail(f"unknown key {key!r} in {what}{hint} (known keys: {known})", key_node, owner)
            if key in fields:
                raise self.fail(f"key {key!r} appears twice", key_node, owner)
            fields[key] = value_node
        return fields

    def text(
        self, fields: Mapping[str, yaml.Node], key: str, owner: str | None, default: str = "", *, numbers: bool = True
    ) -> str:
        """A scalar as text; a number is written back as text unless ``numbers`` is false, for values where YAML
        has already changed what was written (``1.50`` reads as 1.5)."""
        value_node = fields.get(key)
        if value_node is None:
            return default
        if not isinstance(value_node, yaml.ScalarNode):
            raise self.fail(f"{key!r} must be text", value_node, owner)
        value = self.loader.construct_object(value_node)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, str | int | float if numbers else str):
            raise self.fail(f"{key!r} must be text, not {type(value).__name__} (quote it)", value_node, owner)
        return str(value)

    def identifier(self, fields: Mapping[str, yaml.Node], yaml_node: yaml.Node, what: str) -> str:
        if "id" not in fields:
            raise self.fail(f"{what} needs an 'id'", yaml_node, None)
        value = self.text(fields, "id", None)
        if not value.strip():
            raise self.fail(f"{what}'s 'id' must not be empty", fields["id"], None)
        return value

    def sequence(self, fields: Mapping[str, yaml.Node], key: str, owner: str) -> list[yaml.Node]:
        value_node = fields.get(key)
        if value_node is None:
            return []
        if isinstance(value_node, yaml.ScalarNode) and self.loader.construct_object(value_node) is None:
            return []
        if not isinstance(value_node, yaml.SequenceNode):
            raise self.fail(f"{key!r} must be a list", value_node, owner)
        return list(value_node.value)

    def choice(
        self, fields: Mapping[str, yaml.Node], key: str, owner: str, parse: Callable[[str], Any], default: Any
    ) -> Any:
        if key not in fields:
            return default
        raw = self.text(fields, key, owner)
        try:
            return parse(raw)
        except ValueError:
            raise self.fail(f"{key!r} cannot be {raw!r}", fields[key], owner) from None

    def node(self, yaml_node: yaml.Node, inherited: LabelScheme) -> Node:
        fields = self.mapping(yaml_node, _NODE_KEYS, "a node", None)
        node_id = self.identifier(fields, yaml_node, "a node")
        scheme = self.choice(fields, "label_scheme", node_id, LabelScheme, inherited)
        children = [self.node(child, scheme) for child in self.sequence(fields, "children", node_id)]
        options = [self.option(item, node_id) for item in self.sequence(fields, "options", node_id)]
        if children and options:
            raise self.fail("a node has either 'children' or 'options', never both", yaml_node, node_id)
        return Node(
            id=node_id,
            label=self.text(fields, "label", node_id),
            description=self.text(fields, "description", node_id),
            label_scheme=scheme,
            children=tuple(children),
            options=tuple(options),
            line=yaml_node.start_mark.line + 1,
        )

    def option(self, yaml_node: yaml.Node, owner: str) -> Option:
        fields = self.mapping(yaml_node, _OPTION_KEYS, "an option", owner)
        option_id = self.identifier(fields, yaml_node, "an option")
        kind = self.choice(fields, "kind", option_id, OptionKind, OptionKind.ANSWER)
        option = Option(
            id=option_id,
            kind=kind,
            label=self.text(fields, "label", option_id),
            description=self.text(fields, "description", option_id),
            text=self.text(fields, "text", option_id) if "text" in fields else None,
            template=self.text(fields, "template", option_id) if "template" in fields else None,
            slots=tuple(self.slot(item, option_id) for item in self.sequence(fields, "slots", option_id)),
            steps=self.text(fields, "steps", option_id) if "steps" in fields else None,
            origin=self.choice(fields, "origin", option_id, Origin, Origin.SEED),
            line=yaml_node.start_mark.line + 1,
        )
        required = {OptionKind.ANSWER: "text", OptionKind.TEMPLATE: "template", OptionKind.PROCEDURE: "steps"}
        if getattr(option, required[kind]) is None:
            raise self.fail(f"a {kind.value} option needs {required[kind]!r}", yaml_node, option_id)
        return option

    def slot(self, yaml_node: yaml.Node, owner: str) -> Slot:
        fields = self.mapping(yaml_node, _SLOT_KEYS, "a slot", owner)
        if "name" not in fields:
            raise self.fail("a slot needs a 'name'", yaml_node, owner)
        instruction = self.text(fields, "instruction", owner)
        fixed = self.text(fields, "fixed", owner) if "fixed" in fields else None
        if (instruction == FIXED_INSTRUCTION) != (fixed is not None):
            raise self.fail("a slot has 'fixed' exactly when its instruction is the word 'fixed'", yaml_node, owner)
        name = self.text(fields, "name", owner)
        pattern = self.text(fields, "pattern", owner, numbers=False) if "pattern" in fields else None
        slot = Slot(name=name, instruction=instruction, fixed=fixed, pattern=pattern)
        problem = slot.pattern_problem()
        if problem is not None:
            raise self.fail(f"slot {name!r}: {problem}", fields["pattern"], owner)
        return slot


def dump_tree(tree: Tree | Node) -> str:
    """The compact YAML of a tree: every field equal to its default is left out."""
    root = tree.root if isinstance(tree, Tree) else tree
    return _compact_yaml(_node_data(root, LabelScheme.LETTERS))


def _compact_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=1 << 30)


def write_tree(tree: Tree | Node, path: str | Path) -> None:
    """Write the compact YAML of a tree to ``path`` (UTF-8), atomically: a reader sees the old tree or the new. A
    write that fails (a folder in the way, no space) raises ``TreeFileError`` naming the file; nothing is left
    half-written."""
    text = dump_tree(tree)
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        raise TreeFileError(f"cannot write the tree file ({type(exc).__name__}: {exc})", path=str(path)) from exc


class _Dumper(yaml.SafeDumper):
    """SafeDumper that keeps multi-line text readable as a literal block."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # YAML 1.1 reads NEL (U+0085) as a line break: in a block or plain scalar it would come back as "\n" or a
    # space. Only a double-quoted scalar escapes it ("\N"), so such text is written that way.
    style = '"' if "\x85" in value else "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _node_data(node: Node, inherited: LabelScheme) -> dict[str, Any]:
    data: dict[str, Any] = {"id": node.id}
    if node.label != node.id:
        data["label"] = node.label
    if node.description:
        data["description"] = node.description
    if node.label_scheme is not inherited:
        data["label_scheme"] = node.label_scheme.value
    if node.children:
        data["children"] = [_node_data(child, node.label_scheme) for child in node.children]
    if node.options:
        data["options"] = [_option_data(option) for option in node.options]
    return data


def _option_data(option: Option) -> dict[str, Any]:
    data: dict[str, Any] = {"id": option.id}
    if option.kind is not OptionKind.ANSWER:
        data["kind"] = option.kind.value
    if option.label != option.id:
        data["label"] = option.label
    if option.description:
        data["description"] = option.description
    for key in ("text", "template"):
        value = getattr(option, key)
        if value is not None:
            data[key] = value
    if option.slots:
        data["slots"] = [_slot_data(slot) for slot in option.slots]
    if option.steps is not None:
        data["steps"] = option.steps
    if option.origin is not Origin.SEED:
        data["origin"] = option.origin.value
    return data


def _slot_data(slot: Slot) -> dict[str, Any]:
    data: dict[str, Any] = {"name": slot.name, "instruction": slot.instruction}
    if slot.fixed is not None:
        data["fixed"] = slot.fixed
    if slot.pattern is not None:
        data["pattern"] = slot.pattern
    return data
