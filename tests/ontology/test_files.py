"""Tree files: what loads, what the writer leaves out, and the errors that name file, line and node."""

from __future__ import annotations

import re
import textwrap
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gil_core.errors import GilError, LabelCapacityError, TreeFileError
from gil_core.ontology import (
    LabelScheme,
    Node,
    Option,
    OptionKind,
    Origin,
    Slot,
    Tree,
    TreeLintWarning,
    dump_tree,
    lint_tree,
    load_tree,
    parse_tree,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tree.yaml"
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def load_error(path: Path) -> TreeFileError:
    with pytest.raises(TreeFileError) as caught:
        load_tree(path)
    return caught.value


def test_a_yaml_syntax_error_names_file_line_and_the_enclosing_node(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: root
        children:
        - id: billing
          description: "unclosed
        - id: shipping
        """,
    )
    error = load_error(path)
    assert error.path == str(path) and error.node == "billing" and error.line is not None
    assert error.line >= 4
    assert f"{path}:{error.line}" in str(error) and "'billing'" in str(error)
    assert isinstance(error, GilError)


def test_a_duplicate_id_names_the_line_of_the_second_one(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: root
        children:
        - id: billing
          options:
          - id: refund
            text: a
        - id: refund
          description: again
        """,
    )
    error = load_error(path)
    assert (error.line, error.node) == (7, "refund")
    assert "duplicate id (first at line 5)" in str(error) and f"{path}:7" in str(error)


def test_a_node_with_children_and_options_is_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: root
        children:
        - id: billing
          children:
          - id: cards
          options:
          - id: refund
            text: a
        """,
    )
    error = load_error(path)
    assert (error.line, error.node) == (3, "billing")
    assert "either 'children' or 'options'" in str(error)


def test_more_candidates_than_the_scheme_holds_is_a_capacity_error(tmp_path: Path) -> None:
    options = "".join(f"  - id: o{i}\n    text: t{i}\n" for i in range(10))
    path = write(tmp_path, "id: root\nlabel_scheme: digits\noptions:\n" + options)
    error = load_error(path)
    assert isinstance(error, LabelCapacityError)
    assert (error.line, error.node) == (1, "root") and "capacity of 9" in str(error)


@pytest.mark.parametrize(
    ("body", "line", "node", "words"),
    [
        ("id: root\ncolour: red\n", 2, None, "unknown key 'colour' in a node (known keys:"),
        ("id: root\noptions:\n- id: a\n  labl: x\n  text: x\n", 4, "root", "'labl' in an option, did you mean 'label'"),
        ("id: root\noptions:\n- text: x\n", 3, None, "an option needs an 'id'"),
        ("id: root\noptions:\n- id: a\n  kind: poem\n  text: x\n", 4, "a", "'kind' cannot be 'poem'"),
        ("id: root\noptions:\n- id: a\n  kind: template\n", 3, "a", "needs 'template'"),
        ("id: root\noptions:\n- id: a\n", 3, "a", "needs 'text'"),
        ("id: root\nchildren: nope\n", 2, "root", "'children' must be a list"),
        ("- id: root\n", 1, None, "must be a mapping"),
        ("description: x\n", 1, None, "needs an 'id'"),
        ("task: t\ntree: t.yaml\n", None, None, "a task file, not a tree file: its tree is the file its 'tree'"),
        ("id: root\noptions:\n- id: a\n  text: [1, 2]\n", 4, "a", "'text' must be text"),
        (
            "id: root\noptions:\n- id: a\n  kind: template\n  template: 'Order {order}'\n",
            3,
            "a",
            "blanks without a slot: order",
        ),
        (
            "id: root\noptions:\n- id: a\n  kind: template\n  template: x\n  slots:\n  - name: s\n"
            "    instruction: fixed\n",
            7,
            "a",
            "exactly when its instruction is the word 'fixed'",
        ),
    ],
)
def test_malformed_files_say_what_and_where(tmp_path: Path, body: str, line: int, node: str | None, words: str) -> None:
    error = load_error(write(tmp_path, body))
    assert (error.line, error.node) == (line, node)
    assert words in str(error) and str(tmp_path / "tree.yaml") in str(error)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    assert "holds no tree" in str(load_error(write(tmp_path, "# nothing\n")))


def test_a_missing_file_is_a_tree_file_error(tmp_path: Path) -> None:
    assert "cannot read" in str(load_error(tmp_path / "absent.yaml"))


def test_label_scheme_is_inherited_and_written_only_where_it_changes() -> None:
    tree = parse_tree(
        "id: root\nchildren:\n- id: a\n  label_scheme: digits\n  children:\n  - id: b\n    options:\n"
        "    - id: x\n      text: t\n"
    )
    assert tree.root.label_scheme is LabelScheme.LETTERS
    assert tree.node("b").label_scheme is LabelScheme.DIGITS
    assert dump_tree(tree).count("label_scheme") == 1


def test_the_writer_omits_defaults_and_keeps_what_differs() -> None:
    option = Option(id="x", label="x", description="", text="hello", origin=Origin.SEED)
    promoted = Option(id="y", label="Why", text="there", origin=Origin.PROMOTED)
    tree = Tree(Node(id="root", label="root", options=(option, promoted)))
    assert dump_tree(tree) == (
        "id: root\noptions:\n- id: x\n  text: hello\n- id: y\n  label: Why\n  text: there\n  origin: promoted\n"
    )


def test_lint_warns_when_sibling_descriptions_share_a_distinctive_word() -> None:
    text = (
        "id: root\nchildren:\n- id: a\n  description: refunds for broken kettles\n  options:\n  - id: x\n"
        "    text: t\n- id: b\n  description: kettles that never arrived\n  options:\n  - id: y\n    text: t\n"
    )
    with pytest.warns(TreeLintWarning, match="'a' and 'b' share kettles"):
        tree = parse_tree(text, source="kettles.yaml")
    assert [f.node for f in lint_tree(tree)] == ["root"]


PATTERN_TREE = """\
id: root
options:
- id: late
  kind: template
  template: Order {order} is late; {team} will write.
  slots:
  - name: order
    instruction: the order number
    pattern: %s
  - name: team
    instruction: fixed
    fixed: the shipping team
"""


def test_a_slot_pattern_loads_and_is_written_back_as_it_was() -> None:
    text = PATTERN_TREE % r"\b([0-9]{4,6})\b"
    tree = parse_tree(text)
    assert tree.option("late").slots == (
        Slot("order", "the order number", pattern=r"\b([0-9]{4,6})\b"),
        Slot("team", "fixed", "the shipping team"),
    )
    assert dump_tree(tree) == text


def test_a_slot_without_a_pattern_is_written_without_one() -> None:
    text = (PATTERN_TREE % "x").replace("    pattern: x\n", "")
    tree = parse_tree(text)
    assert tree.option("late").slots[0].pattern is None
    assert dump_tree(tree) == text and "pattern" not in text


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("'(order'", "'pattern' is no valid regular expression: missing ), unterminated subpattern"),
        ("'a{99999999999}'", "'pattern' is no valid regular expression"),
        ("'(\\d+)-(\\d+)'", "'pattern' has 2 capturing groups: one at most"),
        ("'[0-9]*'", "'pattern' matches the empty string"),
        ("''", "'pattern' matches the empty string"),
        ("~", "'pattern' matches the empty string"),
    ],
)
def test_a_bad_pattern_names_file_line_option_and_slot(tmp_path: Path, pattern: str, words: str) -> None:
    path = write(tmp_path, PATTERN_TREE % pattern)
    error = load_error(path)
    assert (error.line, error.node) == (9, "late")
    assert f"{path}:9: node 'late': slot 'order': {words}" in str(error)


@pytest.mark.parametrize(
    ("pattern", "words"), [("1234", "'pattern' must be text, not int (quote it)"), ("[a, b]", "'pattern' must be text")]
)
def test_a_pattern_yaml_does_not_read_as_text_is_refused(tmp_path: Path, pattern: str, words: str) -> None:
    """Unlike other text, a number is refused: ``1.50`` would already have become 1.5."""
    path = write(tmp_path, PATTERN_TREE % pattern)
    error = load_error(path)
    assert (error.line, error.node) == (9, "late") and f"{path}:9: node 'late': {words}" in str(error)


def test_a_pattern_on_a_fixed_slot_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, PATTERN_TREE % "x" + "    pattern: team\n")
    error = load_error(path)
    assert (error.line, error.node) == (13, "late")
    assert "slot 'team': a fixed slot takes no 'pattern'" in str(error)


@pytest.mark.parametrize("name", ["support.yaml", "home.yaml"])
def test_the_demo_trees_round_trip_byte_for_byte(name: str) -> None:
    """Existing trees (slots without patterns among them) are written back exactly as the files hold them."""
    path = Path(__file__).resolve().parents[2] / "ontologies" / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        assert dump_tree(load_tree(path)) == path.read_text(encoding="utf-8")


_ids = st.text(alphabet="abcdefghijklmnop-", min_size=1, max_size=8).filter(lambda s: s.strip("-"))
_texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=0, max_size=30
) | st.sampled_from(["yes", "null", "~", "1.5", "- x", "a: b", "'q'", "#c", " lead", "trail ", "{x}"])

# Patterns hold backslashes, quotes and YAML's indicators; re.escape of non-empty text never matches the empty
# string, and a group around it is the one group a pattern may have.
_literals = _texts.filter(bool).map(re.escape)
_patterns = st.none() | _literals | _literals.map(lambda pattern: f"({pattern})") | st.just(r"\b([0-9]{4,6})\b")


@st.composite
def trees(draw: st.DrawFn) -> Tree:
    counter = iter(range(10_000))

    def fresh(prefix: str) -> str:
        return f"{prefix}{next(counter)}-{draw(_ids)}"

    def option() -> Option:
        kind = draw(st.sampled_from(list(OptionKind)))
        common = {
            "id": fresh("o"),
            "label": draw(_texts),
            "description": draw(_texts),
            "origin": draw(st.sampled_from(list(Origin))),
        }
        if kind is OptionKind.ANSWER:
            return Option(kind=kind, text=draw(_texts), **common)
        if kind is OptionKind.PROCEDURE:
            return Option(kind=kind, steps=draw(_texts), **common)
        slot = Slot("s", "fixed", draw(_texts)) if draw(st.booleans()) else Slot("s", draw(_ids), None, draw(_patterns))
        return Option(kind=kind, template="before {s} after", slots=(slot,), **common)

    def node(depth: int) -> Node:
        scheme = draw(st.sampled_from(list(LabelScheme)))
        common = {
            "id": fresh("n"),
            "label": draw(_texts),
            "description": draw(_texts),
            "label_scheme": scheme,
        }
        if depth < 2 and draw(st.booleans()):
            return Node(children=tuple(node(depth + 1) for _ in range(draw(st.integers(1, 3)))), **common)
        return Node(options=tuple(option() for _ in range(draw(st.integers(0, 3)))), **common)

    return Tree(node(0))


@settings(max_examples=150, deadline=None)
@given(trees())
def test_write_then_load_gives_the_same_tree_and_the_same_bytes(tree: Tree) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        text = dump_tree(tree)
        again = parse_tree(text)
    assert again.root == tree.root
    assert dump_tree(again) == text


def test_an_options_answer_version_changes_with_its_answer_not_with_how_the_judge_is_shown_it(tmp_path: Path) -> None:
    def version(option: str) -> str:
        path = tmp_path / "tree.yaml"
        path.write_text(f"id: root\noptions:\n{option}", encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = load_tree(path)
        (answer,) = tree.answer_versions
        return answer

    base = version("- id: refund\n  text: Five days.\n")
    assert base.startswith("refund#") and len(base) == len("refund#") + 12
    assert version("- id: refund\n  label: refunds\n  description: money back\n  text: Five days.\n") == base
    assert version("- id: refund\n  text: Three days.\n") != base
    assert version("- id: refund\n  kind: procedure\n  steps: Five days.\n") != base
    assert version("- id: refunds\n  text: Five days.\n") != base
