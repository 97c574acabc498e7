"""The reference's three trees written back by our writer are byte-identical to the files."""

from __future__ import annotations

import filecmp
import warnings

import pytest

from gil_core.ontology import TreeLintWarning, dump_tree, load_tree
from tests.conformance._fixtures import FIXTURES, SHARED, report

TREES = sorted((FIXTURES / "trees").glob("*.yaml"))


def test_every_tree_round_trips_byte_for_byte() -> None:
    assert [path.name for path in TREES] == ["grown.yaml", "seeded.yaml", "support.yaml"]
    differing = []
    for path in TREES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TreeLintWarning)
            tree = load_tree(path)
        if dump_tree(tree) != path.read_text(encoding="utf-8"):
            differing.append(path.name)
    report("trees", len(TREES) - len(differing), len(TREES), "trees byte-identical on round trip")
    assert not differing


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared/conformance beside the project")
def test_the_copied_fixtures_agree_with_shared() -> None:
    """tests/fixtures/conformance is a copy so the project stands alone; it must not drift from shared/."""
    shared = sorted(p.relative_to(SHARED) for p in SHARED.rglob("*") if p.is_file())
    copied = sorted(p.relative_to(FIXTURES) for p in FIXTURES.rglob("*") if p.is_file())
    assert shared == copied
    _, mismatch, errors = filecmp.cmpfiles(SHARED, FIXTURES, [str(p) for p in shared], shallow=False)
    assert (mismatch, errors) == ([], [])
