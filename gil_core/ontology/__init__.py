"""The tree of categories and answers: model, YAML files, lint and label schemes."""

from gil_core.ontology.files import dump_tree, load_tree, parse_tree, write_tree
from gil_core.ontology.labels import LabelScheme
from gil_core.ontology.lint import LintFinding, TreeLintWarning, check_tree, lint_tree
from gil_core.ontology.model import Node, Option, OptionKind, Origin, Slot, Tree

__all__ = [
    "LabelScheme",
    "LintFinding",
    "Node",
    "Option",
    "OptionKind",
    "Origin",
    "Slot",
    "Tree",
    "TreeLintWarning",
    "check_tree",
    "dump_tree",
    "lint_tree",
    "load_tree",
    "parse_tree",
    "write_tree",
]
