"""Label schemes: the one-character labels a judge prompt shows, the first always meaning "none of these"."""

from __future__ import annotations

from enum import StrEnum

from gil_core.errors import LabelCapacityError

__all__ = ["LabelScheme"]


class LabelScheme(StrEnum):
    """A set of single-token labels. Symbol 0 is "none of these"; candidates take the symbols after it."""

    LETTERS = "letters"
    DIGITS = "digits"

    @property
    def symbols(self) -> str:
        """Every symbol of the scheme, in order."""
        return _SYMBOLS[self]

    @property
    def none_symbol(self) -> str:
        """The label of "none of these"."""
        return self.symbols[0]

    @property
    def capacity(self) -> int:
        """How many candidates one prompt can label (every symbol but the none symbol)."""
        return len(self.symbols) - 1

    def candidate_symbols(self, count: int, *, node: str | None = None) -> str:
        """The labels of ``count`` candidates, in order. Raises ``LabelCapacityError`` past capacity."""
        if count > self.capacity:
            raise LabelCapacityError(
                f"{count} candidates exceed the {self.value} scheme's capacity of {self.capacity}",
                node=node,
            )
        return self.symbols[1 : count + 1]


_SYMBOLS = {
    LabelScheme.LETTERS: "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    LabelScheme.DIGITS: "0123456789",
}
