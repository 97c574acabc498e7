"""The learned-reflex benchmark's speed section: what a refit of the learned reflex costs and what its judgment
adds to the request path."""

from __future__ import annotations

import time

import numpy as np

from benchmarks._learned_setup import COMMAND, POLICY, _prior_texts
from benchmarks._quality_streams import home_stream
from benchmarks._report import Row, Section
from gil_core.learned import fit_state
from gil_core.learned.log import Confirmed, LearnedLog, Logged, VerdictDigest
from gil_core.taskfile import load_task_file

__all__ = ["timing_section"]


def timing_section(quick: bool) -> Section:
    """Refit time at 1k and 10k confirmed requests (synthetic clustered vectors over the home tree), and the
    serving cost of one node's learned judgment (numpy only)."""
    tree = load_task_file(home_stream().task_file).task.tree
    rows, notes = [], []
    rng = np.random.default_rng(17)
    options = [option.id for option, _ in tree.options()]
    centres = {option: rng.normal(size=384) for option in options}
    priors_texts = _prior_texts(tree)
    priors = {text: _unit(rng.normal(size=384)) for text in priors_texts}
    # What a process's first refit pays once: the fit path imports scikit-learn and scipy when it first runs.
    started = time.perf_counter()
    import scipy.stats  # type: ignore[import-untyped]  # noqa: F401
    import sklearn.linear_model  # type: ignore[import-untyped]  # noqa: F401

    imports = time.perf_counter() - started
    rows.append(Row("a process's first refit: importing scikit-learn and scipy (once)", "", f"{imports:.2f} s"))
    fitted = None
    for size in (1000,) if quick else (1000, 10_000):
        labels = rng.choice(len(options), size=size)
        vectors = np.vstack([_unit(centres[options[i]] + 2.0 * rng.normal(size=384)) for i in labels]).astype(
            np.float32
        )
        confirmed = tuple(Confirmed(f"t{i}", i, options[label]) for i, label in enumerate(labels))
        logged = tuple(Logged(tree.root.id, i, None, None, 0.9, 0.8, False) for i in range(min(size, 500)))
        log = LearnedLog(confirmed, vectors, logged, VerdictDigest(size, 0))
        started = time.perf_counter()
        fitted = fit_state(
            task="timing", tree=tree, tree_sha256="0" * 64, threshold=lambda node, layer: 0.5,
            policy=POLICY, log=log, priors=priors, embedder="synthetic", dimensions=384,
            previous=None,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        rows.append(Row(f"refit from the log, {size:,} confirmed ({len(fitted.nodes)} nodes)", "", f"{seconds:.2f} s"))
    assert fitted is not None
    root = fitted.nodes[tree.root.id]
    query = _unit(rng.normal(size=384)).astype(np.float32)
    runs = 2000
    started = time.perf_counter()
    for _ in range(runs):
        root.decide(root.predict(query))
    per_node = (time.perf_counter() - started) / runs * 1e6
    rows.append(Row(f"serving one node ({len(root.classes)} classes, {len(root.exemplar_class)} exemplars)", "",
                    f"{per_node:.1f} µs (predict + novelty + rule, numpy)"))  # fmt: skip
    notes.append(
        "Synthetic vectors: 384-dimension clusters, one per answer of the home tree, with noise. The refit is the "
        "whole fit (every node, the rules and the novelty cuts), timed after the imports; reading the log is not "
        "included."
    )
    return Section(
        "Speed: resolver overhead, learned reflex",
        f"{COMMAND} --parts timing",
        "What the learned judge adds to the request path and what a refit costs (part of the resolver overhead).",
        rows,
        notes,
    )


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)
