"""What the batch-on-Dask tests share: distinct tickets routed over the support tree, verdicts on their results,
and the check that a repeated batch is answered from memory exactly where feedback confirmed an answer."""

from __future__ import annotations

import json
import random
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from flows.cli import app
from tests.resolver._support import Script

ROUTES = {
    0: (["billing", "refund status"], "Refunds reach the original payment method within 5 business days of approval."),
    1: (["shipping", "delivery time"], "Standard delivery takes 3 to 5 business days."),
    2: (["billing", "payment methods"], "We accept major credit cards, debit cards and bank transfer."),
}
CORRECTION = "A person will look into this ticket today."
runner = CliRunner()


def ticket_texts(count: int) -> list[str]:
    """Distinct requests that share few character 3-grams, so only a request itself is a memory hit."""
    words = [
        "parcel",
        "invoice",
        "refund",
        "card",
        "courier",
        "password",
        "address",
        "receipt",
        "voucher",
        "login",
        "basket",
        "warranty",
    ]
    draw = random.Random(9)
    return [f"{' '.join(draw.sample(words, 5))} number {draw.randrange(10**6)}" for _ in range(count)]


def scripts(texts: Sequence[str]) -> dict[str, Script]:
    """Ticket ``i`` takes route ``i % 3`` down the tree."""
    return {text: Script(route=ROUTES[i % 3][0]) for i, text in enumerate(texts)}


def write_tickets(path: Path, prefix: str, texts: list[str]) -> None:
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "text": t}) + "\n" for i, t in enumerate(texts)))


def resolve_on_dask(tickets: Path, out: Path, task: Path, *runner_flags: str) -> dict[str, Any]:
    """``gil resolve-batch`` on Dask (``runner_flags``: ``--workers N`` or ``--scheduler ADDRESS``); its summary."""
    command = ["resolve-batch", str(tickets), "--out", str(out), "-t", str(task), "--json"]
    result = runner.invoke(app, [*command, "--task-runner", "dask", *runner_flags])
    assert result.exit_code == 0, result.stderr or result.stdout
    return json.loads(result.stdout.strip().splitlines()[-1])


def read_results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_verdicts(
    path: Path,
    results: list[dict[str, Any]],
    *,
    corrected: Collection[int],
    wrong: Collection[int],
    unjudged: Collection[int] = (),
) -> int:
    """Verdicts on ``results``: wrong with a correction, wrong without one, none at all, else correct; how many."""
    lines = []
    for i, result in enumerate(results):
        if i in unjudged:
            continue
        verdict: dict[str, Any] = {"trace_id": result["trace_id"], "correct": i not in (*corrected, *wrong)}
        if i in corrected:
            verdict["correction"] = CORRECTION
        lines.append(json.dumps(verdict) + "\n")
    path.write_text("".join(lines))
    return len(lines)


def assert_memory_answers_what_was_confirmed(
    repeated: list[dict[str, Any]],
    *,
    corrected: Collection[int],
    wrong: Collection[int],
    unjudged: Collection[int] = (),
) -> None:
    """A repeated ticket is a memory hit exactly when its first answer was confirmed (or corrected), with that
    answer (or the correction); never when it was marked wrong without a correction or had no verdict."""
    for i, result in enumerate(repeated):
        if i in wrong or i in unjudged:
            assert result["mode"] != "memory", (i, result)
        else:
            expected = CORRECTION if i in corrected else ROUTES[i % 3][1]
            assert (result["mode"], result["output"]) == ("memory", expected), (i, result)
