"""`gil ui` and `gil serve` as a user runs them: a real `prefect server start` on loopback, every deployment
registered with its schedule, a served run that publishes its stats artifact, and the UI rendered by headless
Chromium showing both.

Set GIL_UI_SCREENSHOTS=DIR to keep the screenshots (the README's come from here: GIL_UI_SCREENSHOTS=docs).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from flows.deployments import SCHEDULES
from tests.flows._support import write_task_file
from tests.flows._ui_support import (
    CHROMIUM,
    chromium,
    drawn_share,
    free_port,
    gil_command,
    healthy,
    listening_addresses,
    log_tail,
    prefect_env,
    running,
    wait_for,
)
from tests.resolver._support import Script, support_server

pytestmark = pytest.mark.slow

# A `prefect server start` takes 30-60 s on an idle 2-core machine and much longer when the machine is busy.
STARTUP_SECONDS = 300
TICKETS = {
    "t1": "where is my refund?",
    "t2": "how long does delivery take?",
    "t3": "do you sell gift cards?",
    "t4": "where is my refund?",
    "t5": "what does shipping cost?",
}
SCRIPTS = {
    "where is my refund?": Script(route=["billing", "refund status"]),
    "how long does delivery take?": Script(route=["shipping", "delivery time"]),
    "what does shipping cost?": Script(route=["shipping", "shipping cost"]),
}
# ARCHITECTURE.md, "Flows": the default schedule of each deployment.
EXPECTED_SCHEDULES = {
    "resolve-batch": ("interval", timedelta(minutes=5)),
    "apply-feedback": ("interval", timedelta(minutes=5)),
    "fit-energy": ("cron", "0 3 * * *"),
    "fit-reflex": ("cron", "0 3 * * *"),
    "rebuild-memory": None,
    "compact-telemetry": ("interval", timedelta(hours=1)),
    "promotion-round": ("cron", "0 6 * * 1"),
    "deactivation-round": ("cron", "0 6 * * 1"),
    "differentiation-round": ("cron", "0 6 * * 1"),
}


@dataclass
class PrefectUI:
    port: int
    task: Path
    tickets: Path
    verdicts: Path
    ui: Any
    serve: Any
    logs: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"


@contextlib.contextmanager
def prefect_client(api_url: str) -> Iterator[Any]:
    """The Prefect client of this test process, pointed at the `gil ui` server."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        yield client


@pytest.fixture(scope="module")
def prefect_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectUI]:
    """`gil ui` on a free loopback port, then `gil serve` against it, with a private PREFECT_HOME."""
    root = tmp_path_factory.mktemp("gil-ui")
    env = prefect_env(root / "prefect-home")
    port = free_port()
    with contextlib.ExitStack() as stack:
        model = stack.enter_context(support_server(SCRIPTS, default=Script(answers=["None of these"])))
        ui = stack.enter_context(running(gil_command("ui", "--port", str(port)), root / "ui.log", env, root))
        wait_for(healthy(f"http://127.0.0.1:{port}/api"), "gil ui /api/health", STARTUP_SECONDS, ui, root / "ui.log")
        task = write_task_file(root, model.base_url)
        tickets = root / "tickets.jsonl"
        tickets.write_text("".join(json.dumps({"id": key, "text": text}) + "\n" for key, text in TICKETS.items()))
        verdicts = root / "queue" / "verdicts.jsonl"  # absent: `gil serve` creates the queue file
        arguments = ["-t", str(task), "--tickets", str(tickets), "--verdicts", str(verdicts)]
        serve = stack.enter_context(
            running(
                gil_command("serve", *arguments, "--api-url", f"http://127.0.0.1:{port}/api"),
                root / "serve.log",
                {**env, "PREFECT_RUNNER_POLL_FREQUENCY": "2"},  # pick up a triggered run within 2 s, not 10
                root,
            )
        )
        yield PrefectUI(port, task, tickets, verdicts, ui, serve, root)


@pytest.fixture(scope="module")
def deployments(prefect_ui: PrefectUI) -> dict[str, Any]:
    """The deployments on the server, read through the Prefect client once `gil serve` registered all of them."""
    with prefect_client(prefect_ui.api_url) as client:

        def registered() -> dict[str, Any] | None:
            found = {deployment.name: deployment for deployment in client.read_deployments()}
            return found if set(SCHEDULES) <= set(found) else None

        return wait_for(registered, "deployments", STARTUP_SECONDS, prefect_ui.serve, prefect_ui.logs / "serve.log")


@pytest.fixture(scope="module")
def stats_artifact(prefect_ui: PrefectUI, deployments: dict[str, Any]) -> tuple[Any, Any]:
    """The resolve-batch deployment triggered through the API and run by `gil serve`; its run and stats table."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.deployments import run_deployment

    with prefect_client(prefect_ui.api_url) as client:
        run = run_deployment("resolve-batch/resolve-batch", timeout=STARTUP_SECONDS, poll_interval=1)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["support-stats"])))
    assert run.state is not None and run.state.is_completed(), f"{run.state}\n{log_tail(prefect_ui.logs / 'serve.log')}"
    assert len(artifacts) == 1
    return run, artifacts[0]


def schedule_of(deployment: Any) -> tuple[str, object] | None:
    if not deployment.schedules:
        return None
    (schedule,) = [entry.schedule for entry in deployment.schedules]
    return ("cron", schedule.cron) if hasattr(schedule, "cron") else ("interval", schedule.interval)


def test_gil_serve_registers_every_deployment_with_its_schedule(
    prefect_ui: PrefectUI, deployments: dict[str, Any]
) -> None:
    assert set(deployments) == set(EXPECTED_SCHEDULES)
    assert {name: schedule_of(deployment) for name, deployment in deployments.items()} == EXPECTED_SCHEDULES
    for name, deployment in deployments.items():
        flow = SCHEDULES[name][0]
        assert deployment.entrypoint == f"{flow.fn.__module__}.{flow.fn.__name__}"
        assert deployment.parameters["task_file"] == str(prefect_ui.task.resolve())
        assert not deployment.paused and all(entry.active for entry in deployment.schedules)
    assert deployments["resolve-batch"].parameters["tickets"] == str(prefect_ui.tickets.resolve())
    assert deployments["apply-feedback"].parameters["verdicts"] == str(prefect_ui.verdicts.resolve())
    assert prefect_ui.verdicts.read_text() == ""  # created empty, so the 5-minute runs have nothing to fail on


def test_gil_serve_without_a_prefect_server_fails_in_one_line(tmp_path: Path) -> None:
    task = write_task_file(tmp_path, "http://127.0.0.1:9/v1")
    api_url = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    done = subprocess.run(
        gil_command("serve", "-t", str(task), "--api-url", api_url),
        capture_output=True,
        env=prefect_env(tmp_path / "prefect-home"),
        cwd=tmp_path,
        timeout=STARTUP_SECONDS,
        check=False,
    )
    errors = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and len(errors) == 1, done.stderr.decode()
    assert f"no Prefect API at {api_url}" in errors[0] and "start `gil ui` first" in errors[0]


def test_gil_ui_and_gil_serve_listen_on_loopback_only(prefect_ui: PrefectUI, deployments: dict[str, Any]) -> None:
    # `gil ui` becomes the server process itself: nothing else holds a port once it is stopped.
    assert listening_addresses(prefect_ui.ui.pid) == {("127.0.0.1", prefect_ui.port)}
    assert {address for address, _ in listening_addresses(prefect_ui.serve.pid)} <= {"127.0.0.1"}


def test_a_served_run_publishes_the_stats_artifact(prefect_ui: PrefectUI, stats_artifact: tuple[Any, Any]) -> None:
    run, artifact = stats_artifact
    assert artifact.flow_run_id == run.id  # published by the run that `gil serve` executed
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    # Four tickets routed to a tree answer, one (no script: "None of these") out of the tree.
    assert {row["mode"]: row["requests"] for row in rows} == {"habit/answer": 4, "fallback": 1}
    results = Path(f"{prefect_ui.tickets}.results.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in results) == sorted(TICKETS)


@pytest.mark.browser
@pytest.mark.skipif(os.environ.get("GIL_SKIP_BROWSER") == "1", reason="GIL_SKIP_BROWSER=1")
def test_headless_chromium_shows_the_deployments_and_an_artifact(
    prefect_ui: PrefectUI, deployments: dict[str, Any], stats_artifact: tuple[Any, Any], tmp_path: Path
) -> None:
    assert shutil.which("chromium") or Path(CHROMIUM).is_file(), (
        "Debian's chromium is missing: `apt-get install chromium` (as .ci/run does), or set GIL_SKIP_BROWSER=1"
    )
    _, artifact = stats_artifact
    pages = {
        "deployments": (f"{prefect_ui.url}/deployments", sorted(deployments)),
        "artifact": (f"{prefect_ui.url}/artifacts/artifact/{artifact.id}", ["support-stats", "fallback"]),
    }
    for name, (url, expected) in pages.items():
        png = tmp_path / f"prefect-ui-{name}.png"
        dom = chromium(url, png)
        missing = [text for text in expected if text not in dom]
        assert not missing, f"{url} rendered without {missing}"
        assert "Can't connect to Server API" not in dom
        assert drawn_share(png) > 0.02, f"{png} is nearly blank"
        if target := os.environ.get("GIL_UI_SCREENSHOTS"):
            Path(target).mkdir(parents=True, exist_ok=True)
            shutil.copy(png, Path(target) / png.name)
