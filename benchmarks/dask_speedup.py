"""Batches on Dask: the same batch of tickets through the resolve-batch flow against the scripted loopback server
with a fixed per-call latency, on a Dask LocalCluster of 1 worker process and of 4.

Why: a batch waits on model calls, and one process also spends CPU per ticket (prompts, judging, validated
Parquet appends). More worker processes keep more calls in flight and spread the CPU over the cores, as long as
the model servers' bound (a Prefect global concurrency limit per server) allows. Each arm gets a fresh store,
memory and server; its cluster is started and warmed (modules imported) before the clock starts, and the time
is the flow run's wall time: planning, the chunks, the results file and the stats artifact.

Run ``uv run --extra local python -m benchmarks.dask_speedup``; it prints the BENCHMARKS.md section.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from hashlib import sha1
from pathlib import Path
from typing import Any, cast

COMMAND = "uv run --extra local python -m benchmarks.dask_speedup"


@dataclass(frozen=True)
class Arm:
    workers: int
    budget: int  # the model server's global concurrency limit: calls in flight across all workers
    seconds: float
    tickets: int
    calls: int
    cluster_seconds: float

    @property
    def throughput(self) -> float:
        return self.tickets / self.seconds


def write_tickets(path: Path, count: int) -> None:
    """``count`` distinct requests (memory starts empty, so none is a hit)."""
    lines = (
        json.dumps({"id": f"t{i:05d}", "text": f"request {i} about {sha1(str(i).encode()).hexdigest()[:12]}"})
        for i in range(count)
    )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_arm(tickets: Path, count: int, workers: int, budget: int, latency: float) -> Arm:
    from distributed import Client, LocalCluster

    from flows.batch import resolve_batch_flow
    from gil_core.testing import ScriptedOpenAIServer
    from tests.flows._support import write_task_file
    from tests.resolver._support import Script, SupportModel

    work = Path(tempfile.mkdtemp(prefix=f"gil-dask-bench-{workers}-"))
    model = SupportModel({}, default=Script(route=["billing", "refund status"]))
    started = time.perf_counter()
    with (
        LocalCluster(
            n_workers=workers, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.run(__import__, "flows.batch")  # each worker imports Prefect, LanceDB and Gil before the clock
        cluster_seconds = time.perf_counter() - started
        with ScriptedOpenAIServer(responder=model, latency_seconds=latency) as server:
            # the scripted server is not rate-limited: the only bound is the concurrency limit
            task = write_task_file(work, server.base_url, concurrency=budget, client={"requests_per_second": 0})
            clock = time.perf_counter()
            returned = asyncio.run(
                resolve_batch_flow(
                    str(task),
                    str(tickets),
                    str(work / "results.jsonl"),
                    budget,
                    "dask",
                    workers,
                    cluster.scheduler_address,
                )
            )
            seconds = time.perf_counter() - clock
            # A flow that returns a State (a skipped batch's Completed) hands its caller that state's data: a dict.
            report = cast("dict[str, Any]", returned)
            calls = sum(1 for request in server.requests if request.path.endswith("/chat/completions"))
    if report["resolved"] != count or report["failed"]:
        raise SystemExit(f"{workers} workers: resolved {report['resolved']} of {count}, failed {report['failed'][:3]}")
    return Arm(workers, budget, seconds, count, calls, cluster_seconds)


def section(arms: list[Arm], options: argparse.Namespace, load: float) -> str:
    base = arms[0]
    rows = [
        f"| {arm.workers} | {arm.budget} | {arm.seconds:.1f} | {arm.throughput:.1f} | "
        f"{arm.throughput / base.throughput:.2f}× | {arm.calls / arm.tickets:.2f} | "
        f"{arm.calls / arm.seconds * options.latency:.1f} | {arm.cluster_seconds:.0f} |"
        for arm in arms
    ]
    flags = (
        f"--tickets {options.tickets} --latency {options.latency} --per-worker {options.per_worker} "
        f"--workers {' '.join(map(str, options.workers))}"
    )
    return "\n".join(
        [
            "## Batches on Dask",
            "",
            f"Command: `{COMMAND} {flags}` — run {options.date}.",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs shared with other work (1-minute load average up "
            f"to {load:.1f} during the run), Python {platform.python_version()}.",
            "",
            f"{options.tickets:,} distinct tickets through the `resolve-batch` flow (`task_runner='dask'`) against "
            f"`ScriptedOpenAIServer` on loopback answering every call after a fixed {options.latency * 1000:.0f} ms; "
            f"memory on (hash embedder, LanceDB), every ticket a habit answer after two one-token judgments. Each "
            f"worker process may keep {options.per_worker} calls in flight: the server's global concurrency limit is "
            f"{options.per_worker} × workers. Each arm has its own store, memory, server and warmed cluster.",
            "",
            "| workers | limit (calls in flight) | flow s | tickets/s | speed-up | calls/ticket | mean calls in flight "
            "| cluster start s |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds the server takes per call")
    parser.add_argument("--per-worker", type=int, default=4, help="calls in flight each worker process may hold")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    parser.add_argument("--output", type=Path, help="also write the section into this file")
    options = parser.parse_args()
    os.environ.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1", PREFECT_LOGGING_LEVEL="WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    from prefect.testing.utilities import prefect_test_harness

    tickets = Path(tempfile.mkdtemp(prefix="gil-dask-bench-")) / "tickets.jsonl"
    write_tickets(tickets, options.tickets)
    load = os.getloadavg()[0]
    arms = []
    with prefect_test_harness(server_startup_timeout=180):
        for workers in options.workers:
            arm = run_arm(tickets, options.tickets, workers, options.per_worker * workers, options.latency)
            load = max(load, os.getloadavg()[0])
            print(f"{workers} workers: {arm.seconds:.1f} s, {arm.throughput:.1f} tickets/s", flush=True)
            arms.append(arm)
    text = section(arms, options, load)
    print(text)
    if options.output:
        options.output.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":  # Dask starts its workers with 'spawn': they import this module, and must not run it
    main()
