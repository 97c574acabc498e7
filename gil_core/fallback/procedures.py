"""A procedure habit's output: the generator writes the answer following the habit's steps.

A procedure is a habit whose wording depends on the request, so it is generated like a fallback but with the
steps given as instructions and a plain text contract.
"""

from __future__ import annotations

from collections.abc import Sequence

from gil_core.errors import ConfigurationError
from gil_core.fallback.contracts import TextContract
from gil_core.fallback.generator import FallbackGenerator, Generation
from gil_core.ontology.model import Option, OptionKind

__all__ = ["run_procedure"]


async def run_procedure(
    generator: FallbackGenerator,
    request: str,
    option: Option,
    *,
    path: Sequence[str] = (),
    node_id: str | None = None,
) -> Generation:
    """The answer ``option``'s steps give for ``request``; a ConfigurationError when it is not a procedure."""
    if option.kind is not OptionKind.PROCEDURE or not option.steps:
        raise ConfigurationError(f"option {option.id!r} is not a procedure with steps")
    return await generator.generate(request, TextContract(), path=path, instructions=option.steps, node_id=node_id)
