"""The learned judge's guess (``learned_reflex.guess``) through the real resolver, store and loopback model: below
the root, where the learned judge may not serve yet and the LLM does not settle the node, the learned choice
settles it if the log shows the LLM there worse; never at the root, never for a novel request, and the trace says
so. The model judges badly (it answers "none of these" to everything), so what comes out right was learned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from gil_core.batch import ticket_trace_id
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from tests.learned._support import bad_model, embedder, learned_task, run_with_feedback, support_stream

TRAIN = 80  # two rounds of feedback: the root serves, the leaves are still learning


async def _run(root: Path, *, guess: bool) -> tuple[pl.DataFrame, dict[str, str | None]]:
    """Train on the first TRAIN requests of the support stream, then answer the next 40: their traces and outputs."""
    task = learned_task(guess=guess)
    stream = support_stream()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(root), reflex_embedder=embedder())
            for start in range(0, TRAIN, 40):
                await run_with_feedback(resolver, task, stream[start : start + 40])
            outputs = await run_with_feedback(resolver, task, stream[TRAIN : TRAIN + 40])
    ids = [ticket_trace_id(task.name, example.id) for example in stream[TRAIN : TRAIN + 40]]
    return resolver.store.read("traces").filter(pl.col("trace_id").is_in(ids)), outputs


def _guessed_steps(traces: pl.DataFrame) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(trace row, step) for every guessed step."""
    return [
        (row, step)
        for row in traces.iter_rows(named=True)
        for step in json.loads(row["path"] or "[]")
        if step.get("decided_by") == "guess"
    ]


async def test_learned_guess_settles_below_the_root_where_the_llm_is_worse(tmp_path: Path) -> None:
    """The same stream with and without guesses: with them, leaves the bad model exits are settled by the learned
    choice (recorded as a guess, the model's judgment kept as its audit, the request counted as the LLM's), and
    more answers come out right; without them, those requests go to generation as before."""
    stream = support_stream()[TRAIN : TRAIN + 40]
    on, on_outputs = await _run(tmp_path / "on", guess=True)
    off, off_outputs = await _run(tmp_path / "off", guess=False)
    assert not _guessed_steps(off)
    guessed = _guessed_steps(on)
    assert guessed, "no guessed step: the protocol no longer reaches a leaf that is learning"
    for row, step in guessed:
        assert step["layer"] > 1  # never at the root
        assert step["outcome"] == "accept" and step["chosen"] == step["learned"]["choice"]
        assert step["learned"]["why"] in ("below_cut", "not_serving")
        assert step["audit"] is not None and step["audit"]["choice"] is None  # the model did not settle it
        assert row["decider"] == "llm" and row["mode"].startswith("habit/")
    right_on = sum(on_outputs[example.id] == example.answer for example in stream)
    right_off = sum(off_outputs[example.id] == example.answer for example in stream)
    guessed_ids = {row["trace_id"] for row, _ in guessed}
    off_modes = dict(off.select("trace_id", "mode").iter_rows())
    assert {off_modes[trace_id] for trace_id in guessed_ids} <= {"fallback", "partial"}
    assert right_on > right_off, (right_on, right_off)


async def test_learned_guess_is_off_where_the_llm_is_not_worse(tmp_path: Path) -> None:
    """A node whose logged comparison does not show the LLM worse is never guessed: with no evidence at all
    (before any verdict) no step is a guess."""
    task = learned_task()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await run_with_feedback(resolver, task, support_stream()[:40])
    assert not _guessed_steps(resolver.store.read("traces"))
