"""Reading a configuration file's YAML (tree files, task files) within bounds, so that a hostile file is refused
at once instead of exhausting memory or the stack: a cap on the file's size, on how deep it nests, and on how
many nodes it stands for once its aliases are expanded (a recursive alias or a billion-laughs file); and the
hint an unknown key's error gives when it looks like a misspelt known one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "BoundedLoader",
    "YAMLLimitError",
    "misspelt",
    "read_config_text",
]

MAX_CONFIG_BYTES = 16 * 1024 * 1024
"""The largest configuration file read: 16 times a tree with a 1 MB description."""

MAX_YAML_NODES = 250_000
"""Nodes a file may stand for, every alias counted as the nodes it repeats. The bundled trees have under 500;
composing 250,000 takes about 4 s and 150 MB, so the cap also bounds a huge file without aliases."""

MAX_YAML_DEPTH = 100
"""Nesting levels (a tree about 50 levels deep); deeper nesting would exhaust the composer's stack."""


class YAMLLimitError(yaml.YAMLError):
    """A configuration file exceeds one of the bounds above. ``line`` is where (1-based), when there is a place;
    callers turn it into their own ``GilError`` naming the file."""

    def __init__(self, problem: str, *, line: int | None = None) -> None:
        self.problem, self.line = problem, line
        super().__init__(problem)


def read_config_text(path: Path) -> str:
    """The file's text (UTF-8), read no further than the size cap. Raises ``OSError``, ``UnicodeDecodeError``, or
    ``YAMLLimitError`` for a file larger than ``MAX_CONFIG_BYTES`` (a device or pipe that never ends included)."""
    with path.open("rb") as stream:
        data = stream.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise YAMLLimitError(f"the file is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB")
    return data.decode("utf-8")


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, counting while it composes: an alias adds the nodes of the node it names, an alias
    inside the node it names is refused, and so is nesting past ``MAX_YAML_DEPTH``. The graph it composes shares
    aliased nodes, so the count is what anyone walking it would visit; it stops at the alias that crosses."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded = 0
        self._depth = 0
        self._open: set[str] = set()  # anchors of the nodes being composed: an alias to one is recursive
        self._sizes: dict[str, int] = {}  # nodes each finished anchor stands for

    def compose_node(self, parent: Any, index: Any) -> Any:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise YAMLLimitError(
                    f"the alias *{event.anchor} stands for a node that contains it (a recursive alias)",
                    line=_line(event),
                )
            self._count(self._sizes.get(event.anchor or "", 0), event)
            return super().compose_node(parent, index)
        if self._depth >= MAX_YAML_DEPTH:
            raise YAMLLimitError(f"nested deeper than {MAX_YAML_DEPTH} levels", line=_line(event))
        anchor: str | None = getattr(event, "anchor", None)
        before = self._expanded
        self._count(1, event)
        if anchor is not None:
            self._open.add(anchor)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.discard(anchor or "")
        if anchor is not None:
            self._sizes[anchor] = self._expanded - before
        return node

    def _count(self, nodes: int, event: yaml.Event) -> None:
        self._expanded += nodes
        if self._expanded <= MAX_YAML_NODES:
            return
        if isinstance(event, yaml.AliasEvent):
            problem = (
                f"the alias *{event.anchor} takes the file past {MAX_YAML_NODES:,} YAML nodes once expanded "
                "(an alias bomb, such as a billion-laughs file, is refused)"
            )
        else:
            problem = f"the file holds more than {MAX_YAML_NODES:,} YAML nodes"
        raise YAMLLimitError(problem, line=_line(event))


def _line(event: yaml.Event) -> int | None:
    return event.start_mark.line + 1 if event.start_mark is not None else None


def misspelt(key: object, known: Iterable[str]) -> str:
    """``", did you mean 'x'?"`` when the unknown ``key`` is close to a known one (difflib's ratio ≥ 0.75, as
    "memory_treshold" is to "memory_threshold"), else ``""``: the tail of an unknown key's error."""
    if not isinstance(key, str):
        return ""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f", did you mean {close[0]!r}?" if close else ""
