"""Prompt prefix reuse on the local llama.cpp server (part B of issue #7): the share of judge prompt tokens on
depth-2 paths that the server serves from its prompt cache, by its own count."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from benchmarks._report import ROOT, Row, Section, markdown_table, support_tree
from gil_core.language import ENGLISH
from gil_core.telemetry import TelemetryStore
from gil_core.traverse import Thresholds

__all__ = ["PrefixFigures", "measure_prefix", "prefix_section"]


@dataclass
class PrefixFigures:
    requests: int
    walks: int
    calls: pl.DataFrame  # judge calls of depth-2 walks: layer, prompt_tokens, cached_tokens
    seconds: float


async def measure_prefix(requests: int, root: Path) -> PrefixFigures:
    """Walk the first ``requests`` distinct support tickets down the support tree on a server of our own."""
    from gil_core.judge import SingleTokenJudge
    from gil_core.llm import CallRecorder, trace_scope
    from gil_core.local import LocalLLMServer
    from gil_core.telemetry import EnergyModel
    from gil_core.traverse import GreedyTraverser

    tree = support_tree()
    tickets = [json.loads(line)["text"] for line in (ROOT / "data" / "support_tickets.jsonl").open(encoding="utf-8")]
    texts = list(dict.fromkeys(tickets))[:requests]
    store = TelemetryStore(root / "store")
    started = time.perf_counter()
    with LocalLLMServer(cache_dir=root / "server") as server:
        async with server.chat_model(timeout=600.0) as chat:
            recorder = CallRecorder(chat, sink=store, energy=EnergyModel.tokens())
            # As the demo task judges (its order seed); the tiny model judges poorly, so nothing stops a walk early.
            judge = SingleTokenJudge(recorder, ENGLISH, trust_threshold=0.0, order_seed="demo")
            traverser = GreedyTraverser(judge, Thresholds(per_layer=(0.0,), leaf=0.0))
            for text in texts:
                with trace_scope(uuid.uuid4().hex):
                    await traverser.traverse(text, tree)
    judged = store.read("calls").filter(pl.col("role") == "judge")
    # A depth-2 path is a walk that was judged at layer 2 (a category without candidates is skipped unjudged).
    deep = judged.filter(pl.col("layer") == 2).get_column("trace_id").unique()
    calls = judged.filter(pl.col("trace_id").is_in(deep.implode()) & (pl.col("layer") <= 2)).select(
        "trace_id", "layer", "prompt_tokens", "cached_tokens"
    )
    return PrefixFigures(len(texts), len(deep), calls, time.perf_counter() - started)


def prefix_section(figures: PrefixFigures, command: str) -> Section:
    calls = figures.calls
    prompt, cached = int(calls["prompt_tokens"].sum() or 0), int(calls["cached_tokens"].sum() or 0)
    share = cached / prompt if prompt else 0.0
    per_layer = (
        calls.group_by("layer")
        .agg(pl.col("prompt_tokens").sum(), pl.col("cached_tokens").sum(), pl.len())
        .sort("layer")
    )
    rows = [
        Row(
            "judge prompt tokens served from the server's prompt cache, depth-2 paths (layers 1 and 2)",
            "≥ 50%",
            f"{share:.1%} ({cached:,} of {prompt:,} tokens, {figures.walks} walks of {figures.requests} requests)",
            share >= 0.5 and figures.walks > 0,
        )
    ]
    layers = markdown_table(
        ["layer", "judge calls", "prompt tokens", "cached tokens", "cached share"],
        [
            [row["layer"], row["len"], f"{row['prompt_tokens']:,}", f"{row['cached_tokens']:,}",
             f"{row['cached_tokens'] / row['prompt_tokens']:.1%}" if row["prompt_tokens"] else "—"]
            for row in per_layer.iter_rows(named=True)
        ],
        align="rrrrr",
    )  # fmt: skip
    lead = (
        "SmolLM2-135M on the local llama.cpp server (`gil_core.local.LocalLLMServer`, started for this run), "
        "judging the bundled support tickets down the support tree (`SingleTokenJudge`, the demo's order seed, "
        "every threshold 0 so walks go deep). Cached tokens are the server's own count of prompt tokens it did "
        "not evaluate again (`usage.prompt_tokens_details.cached_tokens`), read from the recorded calls."
    )
    layer_share = {
        row["layer"]: row["cached_tokens"] / max(row["prompt_tokens"], 1) for row in per_layer.iter_rows(named=True)
    }
    notes = [
        "Measured only. The judge prompt is the system message, then the request, then the candidates, and the "
        "server (llama-cpp-python, started without `--cache`) keeps the state of one prompt: the last one. A "
        "layer-2 judgment follows its own request's layer-1 judgment and reuses the system message and the request "
        f"({layer_share.get(2, 0.0):.0%} of its tokens here); a layer-1 judgment follows another request's layer-2 "
        f"prompt and reuses only the chat template and system message ({layer_share.get(1, 0.0):.0%})."
        + (
            " The target is met with the prompt as it is: its order need not change."
            if share >= 0.5
            else " **Miss**, cause: prompt order together with a one-prompt cache. Reordering alone does not "
            "fix it: with candidates before the request, layer 1 would follow a layer-2 prompt whose candidates "
            "differ, and layer 2 would lose the request it now reuses. The prompt order would need to change "
            "(system, the node's candidates in a fixed order, then the request; the order seed shuffles them per "
            "request today) and the server would need to keep several prompt states (llama-cpp-python's `--cache`), "
            "so that each node's prefix is found again; not measured here, and the order change alters the "
            "conformance-pinned prompt bytes."
        )
    ]
    return Section("Speed: prompt prefix reuse (part B)", command, lead, rows, notes, extra_tables=[layers])
