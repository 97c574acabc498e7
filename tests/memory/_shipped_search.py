"""The exact search as shipped before the float32 shortlist (``gil_core/memory/_vectors.py`` at 33290f6): every
row scored in float64 by ``np.einsum``, ties to the earliest row. Tests hold the new search to its answers and
similarities, bit for bit."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def shipped_nearest(rows: NDArray[np.floating], query: NDArray[np.floating], k: int) -> list[tuple[int, float]]:
    """(row, similarity) of the ``k`` best of ``rows`` (insertion order) for ``query``, best first."""
    wide = np.ascontiguousarray(np.asarray(rows, dtype=np.float32), dtype=np.float64)
    target = np.ascontiguousarray(np.asarray(np.reshape(query, (1, -1)), dtype=np.float32), dtype=np.float64)
    lengths = np.einsum("ij,ij->i", wide, wide)
    products = np.einsum("ij,j->i", wide, target[0])
    scale = np.sqrt(lengths * np.einsum("ij,ij->i", target, target)[0])
    similarities = np.divide(products, scale, out=np.zeros(len(wide)), where=scale > 0.0)
    similarities = np.clip(similarities, -1.0, 1.0)
    if k == 1 and len(similarities):
        order = [int(np.argmax(similarities))]
    else:
        order = [int(position) for position in np.argsort(-similarities, kind="stable")[:k]]
    return [(position, float(similarities[position])) for position in order]
