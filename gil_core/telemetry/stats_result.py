"""What ``gil stats`` reports about one task, as values (``TelemetryStore.stats`` computes them,
``gil_core.telemetry.stats``): requests and verdicts per mode and per decider, the memory hits each check took
back, the cost per window of requests and the misroutes; ``Stats.render`` lays them out for a terminal and
``Stats.to_json`` for ``--json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CostWindow", "DeciderStats", "MemoryRefusal", "Misroute", "Misroutes", "ModeStats", "Stats"]


@dataclass(frozen=True, slots=True)
class ModeStats:
    """One mode's requests and verdicts. ``accuracy`` = correct / judged with its 95% Wilson interval
    [``low``, ``high``]; all three are None when no request of the mode was judged."""

    mode: str
    requests: int
    judged: int
    correct: int
    accuracy: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True, slots=True)
class DeciderStats:
    """The requests one decider settled (``schemas.DECIDERS``): their ``share`` of all requests, accuracy over
    the judged ones with its 95% Wilson interval, and their mean energy per request."""

    decider: str
    requests: int
    share: float
    judged: int
    correct: int
    accuracy: float | None
    low: float | None
    high: float | None
    energy_per_request: float


@dataclass(frozen=True, slots=True)
class MemoryRefusal:
    """The memory hits one check took back (``check``: ``guard``, ``memory cut`` read from the log, ``learned
    judge``, ``verification`` that failed, ``tree changed`` for an entry standing for an answer the tree has changed
    or removed since; ``other`` for a reason none of these gave).

    ``judged``: those whose own confirmed answer and the remembered request's are both known (a verdict on each,
    as the log says now); ``remembered_wrong``: of them, the ones whose remembered answer is not the confirmed
    one, so that serving the hit would have been wrong; ``answered_right``: of them, the ones whose answer, found
    the rest of the way, was confirmed."""

    check: str
    hits: int
    judged: int
    remembered_wrong: int
    answered_right: int


@dataclass(frozen=True, slots=True)
class CostWindow:
    """``requests`` consecutive requests (in trace order) from position ``first`` (0-based) and their energy."""

    first: int
    requests: int
    total_energy: float
    mean_energy: float


@dataclass(frozen=True, slots=True)
class Misroute:
    """``count`` requests whose walk ended at ``node`` while their confirmed answer is ``habit``, elsewhere."""

    node: str
    habit: str
    count: int


@dataclass(frozen=True, slots=True)
class Misroutes:
    """Of ``checked`` requests (judged, with a path, confirmed answer a habit of the tree), ``count`` ended at a
    node whose subtree does not hold that habit; ``by_node`` breaks them down, most frequent first."""

    checked: int
    count: int
    by_node: tuple[Misroute, ...]


@dataclass(frozen=True, slots=True)
class Stats:
    """What the log says about one task. Rates are None when the task has no requests; ``misroutes`` is None
    when no tree was given; ``repriced`` says whether chat calls were priced again with a given model.
    ``quarantined_files`` is how many broken files the store (every table, every task) has set aside; their
    footers count ``quarantined_rows`` rows, and ``quarantined_uncounted`` of them have no footer that reads.
    ``memory_not_learned`` is how many of the task's verdicts memory failed to learn and no relearn or rebuild has
    caught up with yet (the ``unlearned_verdicts`` table; ``memory_failures`` counts failed lookups)."""

    task: str
    requests: int
    modes: tuple[ModeStats, ...]
    habit_rate: float | None
    memory_rate: float | None
    memory_failures: int
    window: int
    repriced: bool
    windows: tuple[CostWindow, ...]
    misroutes: Misroutes | None
    deciders: tuple[DeciderStats, ...] = ()
    quarantined_files: int = 0
    quarantined_rows: int = 0
    quarantined_uncounted: int = 0
    memory_not_learned: int = 0
    memory_refused: tuple[MemoryRefusal, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON-ready values (``gil stats --json``): the dataclass tree as dicts and lists."""
        plain: dict[str, Any] = _plain(asdict(self))
        return plain

    def render(self) -> str:
        """A plain-text report for the command line."""
        lines = [f"task {self.task!r}: {self.requests:,} requests"]
        lines.append(f"{'mode':<18}{'requests':>10}{'judged':>10}{'correct':>10}{'accuracy':>10}  95% interval")
        for mode in self.modes:
            interval = "" if mode.low is None else f"[{_percent(mode.low)}, {_percent(mode.high)}]"
            lines.append(
                f"{mode.mode:<18}{mode.requests:>10,}{mode.judged:>10,}{mode.correct:>10,}"
                f"{_percent(mode.accuracy):>10}  {interval}"
            )
        if self.deciders:
            lines.append(
                f"{'settled by':<18}{'share':>10}{'judged':>10}{'accuracy':>10}  95% interval   energy/request"
            )
            for item in self.deciders:
                interval = "" if item.low is None else f"[{_percent(item.low)}, {_percent(item.high)}]"
                lines.append(
                    f"{item.decider:<18}{_percent(item.share):>10}{item.judged:>10,}{_percent(item.accuracy):>10}"
                    f"  {interval:<14} {item.energy_per_request:>12,.2f}"
                )
        lines.append(
            f"habit rate {_percent(self.habit_rate)}   memory rate {_percent(self.memory_rate)}   "
            f"memory failures {self.memory_failures:,}"
        )
        priced = "chat calls repriced" if self.repriced else "energy as recorded"
        lines.append(f"cost per window of {self.window:,} requests ({priced})")
        lines.append(f"{'first':>10}{'requests':>10}{'total':>14}{'mean':>12}")
        lines += [
            f"{cost.first:>10,}{cost.requests:>10,}{cost.total_energy:>14,.1f}{cost.mean_energy:>12,.2f}"
            for cost in self.windows
        ]
        if self.misroutes is not None:
            lines.append(f"misroutes: {self.misroutes.count:,} of {self.misroutes.checked:,} checked")
            lines += [f"  {item.node} ↛ {item.habit}: {item.count:,}" for item in self.misroutes.by_node]
        if self.memory_refused:
            lines.append(f"{'memory refused':<18}{'hits':>10}{'judged':>10}{'memory wrong':>14}{'answered right':>16}")
            lines += [
                f"{item.check:<18}{item.hits:>10,}{item.judged:>10,}{item.remembered_wrong:>14,}"
                f"{item.answered_right:>16,}"
                for item in self.memory_refused
            ]
        if self.memory_not_learned:
            lines.append(
                f"memory did not learn {self.memory_not_learned:,} verdict{'s' if self.memory_not_learned != 1 else ''}"
                ": stored all the same, gil rebuild-memory replays them"
            )
        if self.quarantined_files:
            uncounted = (
                f", {self.quarantined_uncounted:,} without a footer that reads" if self.quarantined_uncounted else ""
            )
            lines.append(
                f"quarantined: {self.quarantined_files:,} broken files of the store set aside "
                f"({self.quarantined_rows:,} rows by their footers{uncounted}); see gil doctor"
            )
        return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
