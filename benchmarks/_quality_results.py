"""The quality benchmark's results (``benchmarks.quality``): what a run measured, per stream, as plain data.

Kept below both the benchmark and its markdown (``_quality_markdown``), which renders these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._quality_report import ArmFigures, Prices


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much of each stream a run takes: ``requests`` per arm (1)-(3) and ``events`` of the repeating stream
    over the same requests for arm (4); cost windows of ``window`` requests."""

    streams: tuple[str, ...]
    requests: int
    events: int
    window: int


@dataclass
class StreamResult:
    """One stream's arms, or why it was skipped."""

    name: str
    title: str
    source: str = ""
    population: int = 0
    skipped: str | None = None
    arms: list[ArmFigures] = field(default_factory=list)
    plot: Path | None = None
    seconds: float = 0.0

    def arm(self, key: str) -> ArmFigures | None:
        return next((arm for arm in self.arms if arm.key == key), None)


@dataclass
class QualityResults:
    """What ``run`` measured. ``benchmarks.quality.section(results, plot_base)`` renders the BENCHMARKS.md
    section, linking the plots as ``plot_base/<file name>``; ``markdown`` is the same with links into ``out_dir``."""

    quick: bool
    sizes: Sizes
    out_dir: Path
    day: str
    seconds: float
    prices: Prices
    streams: list[StreamResult]
    machine: str
    markdown: str = ""

    def plots(self) -> list[Path]:
        return [stream.plot for stream in self.streams if stream.plot is not None]

    def to_json(self) -> dict[str, Any]:
        prices = self.prices
        return {
            "quick": self.quick,
            "sizes": asdict(self.sizes),
            "date": self.day,
            "seconds": self.seconds,
            "machine": self.machine,
            "energy_model": {
                "chat": asdict(prices.chat) if prices.chat is not None else None,
                "embed": asdict(prices.embed) if prices.embed is not None else None,
                "chat_samples": prices.chat_samples,
                "embed_samples": prices.embed_samples,
            },
            "streams": [
                {
                    "stream": stream.name,
                    "skipped": stream.skipped,
                    "seconds": stream.seconds,
                    "plot": str(stream.plot) if stream.plot else None,
                    "arms": [arm.to_json() for arm in stream.arms],
                }
                for stream in self.streams
            ],
        }
