"""What Gil saved, per batch (gil_core.telemetry.savings), from a real store filled by real batches against the
loopback model: who settled each batch's requests, its energy per request, the generation estimate read from
the task's own generation calls, the Markdown and the chart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import polars as pl

from gil_core.batch import Ticket, resolve_batch
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.reporting import savings_markdown
from gil_core.resolver import Resolver
from gil_core.savings_plot import savings_figure, savings_markdown_image, write_savings_plot
from gil_core.telemetry import TelemetryStore
from gil_core.telemetry.savings import compute_savings
from tests.resolver._support import Script, support_server, support_task

ROUTED = "where is my refund?"


def _two_batches(root: Path) -> tuple[TelemetryStore, str, str]:
    """A batch of 4 (one the model routes, three it does not: generation answers them), then one of 2 routed."""
    task = support_task(memory_threshold=None)
    with support_server(
        {ROUTED: Script(route=["billing", "refund status"])}, default=Script(answers=["None of these"])
    ) as server:

        async def run() -> tuple[str | None, str | None]:
            async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
                resolver = Resolver(chat, TelemetryStore(root))
                first = await resolve_batch(
                    resolver, task, [Ticket("a0", ROUTED)] + [Ticket(f"a{i}", f"gift card {i}?") for i in (1, 2, 3)]
                )
                second = await resolve_batch(resolver, task, [Ticket(f"b{i}", ROUTED) for i in range(2)])
                await resolver.resolve(task, "outside any batch")
                return first.batch_id, second.batch_id

        first, second = asyncio.run(run())
    assert first is not None and second is not None
    return TelemetryStore(root), first, second


def test_savings_per_batch_with_the_generation_estimate(tmp_path: Path) -> None:
    store, first, second = _two_batches(tmp_path / "store")
    savings = compute_savings(store, "support")
    assert [batch.batch_id for batch in savings.batches] == [first, second]  # oldest first; the lone request left out
    one, two = savings.batches
    assert (one.requests, two.requests) == (4, 2)
    assert one.shares == {"llm": 0.25, "generation": 0.75} and two.shares == {"llm": 1.0}
    traces = store.read("traces")
    mine = traces.filter(pl.col("batch_id") == first)
    assert abs(one.energy_per_request - mine["energy"].mean()) < 1e-9  # type: ignore[operator]
    generated = store.read("calls").filter(pl.col("role") == "fallback")
    assert savings.generation_calls == generated.height >= 3
    assert abs(savings.generation_energy - generated["energy"].mean()) < 1e-9  # type: ignore[operator]
    ratio = savings.ratio(two)
    assert ratio is not None and ratio < 1.0  # a routed batch costs less than generating every answer
    assert compute_savings(store, "support", batches=1).batches == (two,)


def test_savings_markdown_and_chart(tmp_path: Path) -> None:
    store, _, _ = _two_batches(tmp_path / "store")
    savings = compute_savings(store, "support")
    image = savings_markdown_image(savings)
    assert image is not None and image.startswith("![") and "data:image/svg+xml;base64," in image
    markdown = savings_markdown(savings, image)
    assert "*estimated*" in markdown and markdown.count("\n| 20") == 2  # one row per batch
    assert "| llm | generation |" in markdown and "25%" in markdown and "75%" in markdown
    png = write_savings_plot(savings, tmp_path / "savings.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    figure = savings_figure(savings)  # two batches started within a minute (or a second): told apart
    figure.canvas.draw()
    shares, energy = figure.axes
    labels = [label.get_text() for label in energy.get_xticklabels()]
    assert len(set(labels)) == 2 and labels[0] == f"{savings.batches[0].started_at:%m-%d %H:%M:%S}", labels
    for axes in (shares, energy):  # each legend beside its plot: no bar or point hides under it
        legend = axes.get_legend()
        assert legend is not None and not legend.get_window_extent().overlaps(axes.get_window_extent())
    empty = compute_savings(store, "no such task")
    assert empty.batches == () and empty.generation_energy is None
    assert "No batch yet." in savings_markdown(empty)
