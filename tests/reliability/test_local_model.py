"""The real local model server (llama.cpp, SmolLM2): it listens on loopback only, and stopping it in the middle
of a batch leaves every ticket with exactly one trace, the later ones saying the server cannot be reached."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gil_core.batch import resolve_batch
from gil_core.fallback import TextContract
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.local import LocalLLMServer
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition, TaskPolicy
from gil_core.telemetry import TelemetryStore
from gil_core.traverse import Thresholds
from tests.reliability._support import check_one_trace_per_ticket, make_tickets
from tests.reliability.test_security import is_loopback, listening_addresses
from tests.resolver._support import support_tree

pytestmark = [pytest.mark.reliability, pytest.mark.local_model, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLLMServer]:
    with LocalLLMServer(cache_dir=tmp_path_factory.mktemp("local-llm")) as running:
        yield running


def test_the_local_model_server_listens_on_loopback_only(server: LocalLLMServer) -> None:
    addresses = listening_addresses(server.port)
    assert addresses and all(is_loopback(address) for address in addresses), addresses


@pytest.mark.heavy
async def test_a_batch_outlives_the_local_server_stopping_midway(server: LocalLLMServer, tmp_path: Path) -> None:
    tickets = make_tickets(4, text="my parcel number {index} has not arrived")
    # Straight to one short generation per ticket: the test is about the server going away, not the tree.
    tree = support_tree()
    policy = TaskPolicy(Thresholds((0.6,), 0.7), use_tree=False, fallback_max_attempts=1, fallback_max_tokens=8)
    task = TaskDefinition("support", TextContract(), tree, policy)
    store = TelemetryStore(tmp_path / "store")

    def stop_after_the_first(done: int, total: int) -> None:
        if done == 1:
            server.stop()

    async with OpenAICompatibleChatModel(
        server.base_url, server.model, timeout=60.0, max_attempts=2, max_retry_wait=0.1
    ) as chat:
        # a durable write per request, so progress reports ticket 1 before ticket 2 starts (in a commit group it
        # reports tickets when their group is flushed, which may be after the next one ran)
        report = await resolve_batch(
            Resolver(chat, store), task, tickets, concurrency=1, progress=stop_after_the_first, commit_rows=None
        )
    assert not server.running
    assert (report.resolved, report.failed) == (4, [])
    traces = check_one_trace_per_ticket(store, "support", tickets).sort("created_at")
    failures = traces["failure"].to_list()
    assert failures[0] is None and traces["output"][0]  # answered before the stop
    assert all(failure and "cannot reach the server" in failure for failure in failures[1:]), failures
    assert traces["output"].to_list()[1:] == [None, None, None]


OWNER = """
import sys
from gil_core.local import LocalLLMServer
server = LocalLLMServer(cache_dir=sys.argv[1])
server.start()
print(server.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_the_local_model_server_stops_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """A process starts the real server and is SIGKILLed (no cleanup runs): the server notices it lost its owner
    and stops, instead of holding its memory and port (found: it ran on, reparented to init)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.reliability._support import ROOT

    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "cache")],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line.strip().isdigit(), line
    pid = int(line)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(timeout=30)
    deadline = time.monotonic() + 30.0  # a bound on how long it may take, not a timing claim

    def alive() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]

    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    still = alive()
    if still:
        os.kill(pid, signal.SIGKILL)
    assert not still, "the server outlived its owner by 30 s"
