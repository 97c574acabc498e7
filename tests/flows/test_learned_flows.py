"""The learned reflex through the documented entry points: the resolve-batch and apply-feedback flows under a
real Prefect engine, the ``gil`` command in its own processes, and a refit made in one process picked up by
another before its next batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gil_core.batch import Ticket, ticket_trace_id
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.resolver import Resolver
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from tests.flows._support import write_task_file
from tests.learned._support import bad_model, embedder, run_with_feedback, support_stream

PARAPHRASE = "my money back still has not shown up on my card, when does it come?"
REFUND = "Refunds reach the original payment method within 5 business days of approval."
LEARNED = {"precision": 0.95}


def _tickets(path: Path, items: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in items), encoding="utf-8")
    return path


def _verdicts(path: Path, results: Path, answers: dict[str, str]) -> Path:
    lines = []
    for line in results.read_text(encoding="utf-8").splitlines():
        result = json.loads(line)
        expected = answers[result["id"]]
        right = result["output"] == expected
        lines.append(json.dumps({"trace_id": result["trace_id"], "correct": right, "correction": expected}) + "\n")
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.mark.heavy
@pytest.mark.usefixtures("prefect_harness")
async def test_learned_never_seen_paraphrase_wrong_then_right_after_feedback_on_others_through_the_flows(
    tmp_path: Path,
) -> None:
    """The paraphrase gets no verdict of its own, and memory is off: it comes out right the second time because
    the tree's nodes learned from the other requests' verdicts."""
    from prefect.client.orchestration import get_client

    from flows.batch import apply_feedback_flow, resolve_batch_flow
    from flows.maintenance import fit_reflex_flow

    stream = [e for e in support_stream()[:160] if e.text != PARAPHRASE]
    answers = {e.id: e.answer for e in stream}
    with bad_model() as server:
        task = str(
            write_task_file(
                tmp_path, server.base_url, memory_threshold=None, embedding_model="local", learned_reflex=LEARNED
            )
        )
        first = tmp_path / "first.jsonl"
        await resolve_batch_flow(task, str(_tickets(tmp_path / "p1.jsonl", [("p1", PARAPHRASE)])), out=str(first))
        assert json.loads(first.read_text())["output"] != REFUND
        for number, start in enumerate(range(0, len(stream), 40)):
            chunk = stream[start : start + 40]
            out = tmp_path / f"results-{number}.jsonl"
            tickets = _tickets(tmp_path / f"tickets-{number}.jsonl", [(e.id, e.text) for e in chunk])
            await resolve_batch_flow(task, str(tickets), out=str(out))
            report = await apply_feedback_flow(task, str(_verdicts(tmp_path / f"v-{number}.jsonl", out, answers)))
            assert report["applied"] == len(chunk)
        again = tmp_path / "again.jsonl"
        await resolve_batch_flow(task, str(_tickets(tmp_path / "p2.jsonl", [("p2", PARAPHRASE)])), out=str(again))
    result = json.loads(again.read_text())
    assert result["output"] == REFUND and result["mode"] == "habit/answer"
    store = TelemetryStore(tmp_path / "store")
    traces = store.read("traces")
    (row,) = traces.filter(traces["trace_id"] == result["trace_id"]).iter_rows(named=True)
    assert row["decider"] == "learned"
    assert [step["decided_by"] for step in json.loads(row["path"])] == ["learned", "learned"]
    fitted = await fit_reflex_flow(task)  # the nightly flow: a refit from the log, and its per-node artifact
    assert {node["node"]: node["rule"] for node in fitted["nodes"]}["root"] in ("better", "proven")
    async with get_client() as client:
        keys = {artifact.key for artifact in await client.read_artifacts()}
    assert {"support-learned-reflex", "support-stats-deciders"} <= keys


def _gil(*args: str, columns: str | None = "80") -> subprocess.CompletedProcess[str]:
    """``gil`` in a child process, its output piped; ``columns`` pins the width (COLUMNS), so that a wide local
    terminal cannot hide a table cut to fit; None leaves it to the piped default."""
    command = [sys.executable, "-c", "from flows.cli import main; main()", *args]
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)


async def test_learned_refit_by_gil_feedback_in_another_process_is_used_by_the_next_batch(tmp_path: Path) -> None:
    """A resolver holding a fitted state; ``gil feedback`` in its own process applies verdicts and refits; this
    resolver's next batch uses that file without fitting again itself."""
    stream = support_stream()
    with bad_model() as server:
        path = write_task_file(tmp_path, server.base_url, memory_threshold=None, embedding_model="local",
                               learned_reflex=LEARNED)  # fmt: skip
        task = load_task_file(path).task
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await run_with_feedback(resolver, task, stream[:40])
            learner = resolver.learner
            assert learner is not None
            mine = learner.state("support")
            assert mine is not None and mine.fitted_on["verdicts"] == 40
            fits = learner.fits
            # Resolved here, judged elsewhere: another process gives the verdicts (and refits).
            from gil_core.batch import resolve_batch

            await resolve_batch(resolver, task, [Ticket(e.id, e.text) for e in stream[40:80]])
            traces = resolver.store.read("traces")
            verdicts = tmp_path / "verdicts.jsonl"
            outputs = {row["trace_id"]: row["output"] for row in traces.iter_rows(named=True)}
            verdicts.write_text(
                "".join(
                    json.dumps({"trace_id": (t := ticket_trace_id("support", e.id)), "correct": outputs[t] == e.answer,
                                "correction": e.answer}) + "\n"
                    for e in stream[40:80]
                ),
                encoding="utf-8",
            )  # fmt: skip
            done = _gil("feedback", str(verdicts), "-t", str(path), "--json")
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["applied"] == 40
            await resolve_batch(resolver, task, [Ticket("x1", "where is my refund?")])
            theirs = learner.state("support")
    assert theirs is not None and theirs.fitted_on["verdicts"] == 80 and theirs.name != mine.name
    assert learner.fits == fits  # picked up, not refit here


async def test_learned_gil_fit_reflex_and_stats_name_each_nodes_rule(tmp_path: Path) -> None:
    stream = support_stream()
    with bad_model() as server:
        path = write_task_file(tmp_path, server.base_url, memory_threshold=None, embedding_model="local",
                               learned_reflex=LEARNED)  # fmt: skip
        task = load_task_file(path).task
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await run_with_feedback(resolver, task, stream[:40])
    fitted = _gil("fit-reflex", "-t", str(path), "--json")
    assert fitted.returncode == 0, fitted.stderr
    summary = json.loads(fitted.stdout)
    nodes = {row["node"]: row for row in summary["nodes"]}
    # The bad model's generations (the none answer) were confirmed for the out-of-scope tickets only.
    out_of_scope = sum(e.option is None for e in stream[:40])
    assert summary["generation"] == {**summary["generation"], "asked": 40, "right": out_of_scope, "ask": True}
    learnable = [e for e in stream[:40] if e.option != "change-email"]  # a procedure's answer names no tree answer
    assert nodes["root"]["rule"] == "better" and nodes["root"]["rows"] == len(learnable)
    assert {row["rule"] for row in nodes.values()} <= {"better", "proven", "learning", "withdrawn"}
    shown = _gil("stats", "-t", str(path), "--json")
    assert shown.returncode == 0, shown.stderr
    stats = json.loads(shown.stdout)
    assert {row["node"]: row["rule"] for row in stats["learned"]} == {n: r["rule"] for n, r in nodes.items()}
    deciders = {row["decider"]: row for row in stats["deciders"]}
    assert deciders["generation"]["requests"] == 40 and deciders["generation"]["judged"] == 40
    table = _gil("fit-reflex", "-t", str(path))
    assert table.returncode == 0 and "root" in table.stdout and "better" in table.stdout
    said = f"generation asked (generated the confirmed answer for {out_of_scope} of the latest 40 requests"
    assert said in " ".join(table.stdout.split())  # however the terminal wraps it
    piped = _gil("fit-reflex", "-t", str(path), columns=None)  # to a file or a pipe: no figure cut short
    lines = piped.stdout.splitlines()
    for node, row in nodes.items():
        line = next(line for line in lines if line.lstrip("│┃ ").startswith(f"{node} "))
        figures = [row[key] for key in ("cut", "precision", "lower_bound", "coverage") if row[key] is not None]
        assert figures and all(f"{figure:.3f}" in line for figure in figures), line
    # What each serving node's cuts kept back, as --json counts it, printed a line a node.
    kept = {node: row["withheld"] for node, row in nodes.items() if row["withheld"] and row["withheld"]["novel"][0]}
    assert kept, "no node kept anything back: the lines below are not shown"
    assert "withheld by the cuts among the logged predictions" in piped.stdout
    for node, counts in kept.items():
        line = next(line for line in lines if line.startswith(f"  {node}: "))
        assert f"unlike the confirmed {counts['novel'][0]} ({counts['novel'][1]} right)" in line, line
    (tmp_path / "plain").mkdir()
    refused = _gil("fit-reflex", "-t", str(write_task_file(tmp_path / "plain", "http://127.0.0.1:9/v1")))
    assert refused.returncode == 2 and "no learned_reflex" in refused.stderr
