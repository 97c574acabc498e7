"""`gil ui` and `gil serve` as a user runs them: a real `prefect server start` on loopback, every deployment
registered with its schedule, a served run that publishes its stats artifact, the UI rendered by headless
Chromium showing both, a served promotion round decided in the UI's form, a served feedback queue answered in its
form, a served batch's progress artifact seen moving and its savings chart drawn, by Chromium driven with
Playwright.

Set GIL_UI_SCREENSHOTS=DIR to keep the screenshots (the README's come from here: GIL_UI_SCREENSHOTS=docs).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.cli import app
from flows.deployments import SCHEDULED_DECISION_TIMEOUT, SCHEDULES
from flows.queue import SCHEDULED_VERDICT_TIMEOUT, correction_choices
from gil_core.habits.review_log import Decision, ReviewLog
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer, ScriptedReply
from tests.flows._support import write_task_file
from tests.flows._ui_support import (
    CHROMIUM,
    chromium,
    driven_chromium,
    free_port,
    gil_command,
    healthy,
    keep_screenshot,
    listening_addresses,
    log_tail,
    prefect_env,
    running,
    wait_for,
)
from tests.flows.test_queue_cli import store_with_unconfirmed
from tests.flows.test_queue_pause import KEY, queue_table, stored_verdicts
from tests.flows.test_review_pause import EXPRESS, GIFT, RETURNS, resolve_and_confirm, runner
from tests.learned._support import bad_model
from tests.resolver._support import ROOT, Script, SupportModel, support_server

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # the browser and a served Prefect UI: minutes

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
# docs/architecture.md, "Flows": the default schedule of each deployment.
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
    "feedback-queue": ("cron", "0 3 * * *"),
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
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from prefect.deployments import run_deployment

    with prefect_client(prefect_ui.api_url) as client:
        run = run_deployment("resolve-batch/resolve-batch", timeout=STARTUP_SECONDS, poll_interval=1)
        # this run's: other tests' runs on tasks named `support` publish stats too
        mine = ArtifactFilter(
            key=ArtifactFilterKey(any_=["support-stats"]), flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])
        )
        artifacts = client.read_artifacts(artifact_filter=mine)
    assert run.state is not None and run.state.is_completed(), f"{run.state}\n{log_tail(prefect_ui.logs / 'serve.log')}"
    assert len(artifacts) == 1
    return run, artifacts[0]


def final_state(prefect_ui: PrefectUI, run_id: Any, what: str) -> Any:
    """The state a run ends in, once it ends (``gil serve`` still running)."""
    with prefect_client(prefect_ui.api_url) as client:

        def finished() -> Any | None:
            state = client.read_flow_run(run_id).state
            return state if state is not None and state.is_final() else None

        return wait_for(finished, what, STARTUP_SECONDS, prefect_ui.serve, prefect_ui.logs / "serve.log")


def paused_run(prefect_ui: PrefectUI, run_id: Any, what: str) -> None:
    """Wait until a run `gil serve` executes is paused with its form (failing at once if it ended instead)."""
    with prefect_client(prefect_ui.api_url) as client:

        def paused() -> Any | None:
            state = client.read_flow_run(run_id).state
            assert state is not None and not state.is_final(), f"{state}\n{log_tail(prefect_ui.logs / 'serve.log')}"
            return state if state.is_paused() else None

        wait_for(paused, what, STARTUP_SECONDS, prefect_ui.serve, prefect_ui.logs / "serve.log")


def resume_through_the_form(prefect_ui: PrefectUI, dialog: Any, run_id: Any, attempts: int = 3) -> None:
    """Click the form's Resume until the server takes it. Prefect's server on SQLite may refuse a resume under load
    ("database is locked" in its log: the resume reads the run and then writes its state in one deferred
    transaction, which SQLite refuses without waiting when another write lands in between). That transaction is
    rolled back whole: the run stays paused with no input stored, and the dialog stays open, as a person would see
    it; clicking again is what they would do. A run no longer paused means the resume was taken."""
    from playwright.sync_api import expect

    for _ in range(attempts):
        dialog.get_by_role("button", name="Resume", exact=True).click()
        try:
            expect(dialog).to_be_hidden(timeout=15_000)
            return
        except AssertionError:
            with prefect_client(prefect_ui.api_url) as client:
                state = client.read_flow_run(run_id).state
            if state is None or not state.is_paused():  # taken; the page is slow to close the dialog
                expect(dialog).to_be_hidden(timeout=60_000)
                return
    raise AssertionError(f"the server refused {attempts} resumes\n{log_tail(prefect_ui.logs / 'ui.log')}")


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
    for name in ("promotion-round", "deactivation-round", "differentiation-round"):  # scheduled rounds wait too
        assert deployments[name].parameters["wait_for_decisions"] is True
        assert deployments[name].parameters["decision_timeout"] == SCHEDULED_DECISION_TIMEOUT
    assert deployments["feedback-queue"].parameters["wait_for_verdicts"] is True  # so does the nightly queue
    assert deployments["feedback-queue"].parameters["verdict_timeout"] == SCHEDULED_VERDICT_TIMEOUT
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
        keep_screenshot(png)


@dataclass
class PausedReview:
    run_id: Any
    task: Path
    root: Path
    items: dict[str, str]  # answer text → proposal id


@pytest.fixture(scope="module")
def paused_review(prefect_ui: PrefectUI, deployments: dict[str, Any]) -> PausedReview:
    """The promotion-round deployment run by `gil serve` (waiting for decisions, as scheduled rounds do) on a task
    file with three confirmed recurring answers, once the run is paused with its form."""
    from prefect.deployments import run_deployment

    root = prefect_ui.logs / "review"
    root.mkdir()
    tree_file = root / "support.yaml"
    shutil.copy(ROOT / "ontologies" / "support.yaml", tree_file)
    task = resolve_and_confirm(root, tree_file, (EXPRESS, GIFT, RETURNS))
    parameters = {"task_file": str(task), "decision_timeout": 900, "poll_seconds": 1}
    with prefect_client(prefect_ui.api_url):
        run = run_deployment("promotion-round/promotion-round", parameters=parameters, timeout=0)
    paused_run(prefect_ui, run.id, "the promotion round's pause")
    listed = yaml.safe_load((root / "reviews" / "support-promotion.yaml").read_text(encoding="utf-8"))
    return PausedReview(run.id, task, root, {item["text"]: item["id"] for item in listed["items"]})


@pytest.mark.browser
@pytest.mark.skipif(os.environ.get("GIL_SKIP_BROWSER") == "1", reason="GIL_SKIP_BROWSER=1")
@pytest.mark.filterwarnings("ignore::gil_core.ontology.TreeLintWarning")  # the promoted habit's description
def test_a_served_review_round_is_decided_in_the_browser(
    prefect_ui: PrefectUI, paused_review: PausedReview, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    accept, reject, defer = (paused_review.items[text] for text in (EXPRESS, GIFT, RETURNS))
    answers = {accept: ("accepted", "customers ask every day"), reject: ("rejected", "seasonal")}
    png = tmp_path / "prefect-ui-review.png"
    with driven_chromium(1280, 2100) as page:  # tall enough for the whole dialog
        page.set_default_timeout(60_000)  # a busy 2-core machine renders the first page slowly
        # The UI `gil ui` opens at /: the form's markdown description is drawn in full there (v1's dialog squeezes
        # it to a sliver once the form is taller than the dialog).
        page.goto(f"{prefect_ui.url}/v2/runs/flow-run/{paused_review.run_id}")
        page.get_by_role("button", name="Open menu").first.click()
        page.get_by_role("menuitem", name="Resume").click()
        dialog = page.get_by_role("dialog", name="Resume Flow Run")
        for item in (accept, reject, defer):  # above the form: every proposal with its evidence
            expect(dialog).to_contain_text(item)
        expect(dialog).to_contain_text("4 of 4 generated requests (100%, 95% interval 51%–100%)")
        for item in (accept, reject, defer):
            row = dialog.locator(f"xpath=.//label[normalize-space()='{item} (Optional)']/../../..")
            expect(row.get_by_role("button", name="Select Decision")).to_have_text("deferred")  # the default
            if item in answers:
                decision, reason = answers[item]
                row.get_by_role("button", name="Select Decision").click()
                page.get_by_role("option", name=decision, exact=True).click()
                expect(row.get_by_role("button", name="Select Decision")).to_have_text(decision)
                row.locator("textarea").fill(reason)
        # The screenshot shows the whole form, the proposals' evidence above it: every scrolled box back at its top.
        dialog.evaluate("box => [box, ...box.querySelectorAll('*')].forEach(element => { element.scrollTop = 0 })")
        page.screenshot(path=str(png))
        resume_through_the_form(prefect_ui, dialog, paused_review.run_id)
    keep_screenshot(png)

    state = final_state(prefect_ui, paused_review.run_id, "the resumed round")
    assert state.is_completed(), f"{state}\n{log_tail(prefect_ui.logs / 'serve.log')}"
    # What `gil review` reads: the review log, each row as the form said, the untouched one deferred.
    decisions = ReviewLog(TelemetryStore(paused_review.root / "store")).decisions("support", "promotion")
    assert {item: (entry.decision, entry.note) for item, entry in decisions.items()} == {
        accept: (Decision.ACCEPTED, "customers ask every day"),
        reject: (Decision.REJECTED, "seasonal"),
        defer: (Decision.DEFERRED, None),
    }
    new_tree = paused_review.root / "support.v2.yaml"
    assert new_tree.is_file()

    # The next round, once the task file names the new tree (as the decisions artifact says to do), reads the
    # decisions back: the accepted answer is a habit now, the rejected one is not asked again, the deferred one is.
    data = yaml.safe_load(paused_review.task.read_text(encoding="utf-8"))
    paused_review.task.write_text(yaml.safe_dump({**data, "tree": str(new_tree)}, sort_keys=False), encoding="utf-8")
    result = runner.invoke(app, ["review", "promote", "-t", str(paused_review.task), "--json"])
    assert result.exit_code == 0, result.stderr
    assert [item["id"] for item in json.loads(result.stdout)["items"]] == [defer]


class HeldModel:
    """The support model, except that every request about ``held`` waits until ``release`` is set: a batch held
    part way, for as long as the test needs, with no timing in it."""

    def __init__(self, model: SupportModel, held: str) -> None:
        self.model, self.held = model, held
        self.release = threading.Event()

    def __call__(self, body: Mapping[str, Any]) -> ScriptedReply:
        if self.held in body["messages"][-1]["content"] and not self.release.wait(STARTUP_SECONDS):
            raise AssertionError(f"{self.held!r} was never released")
        return self.model(body)


def reload_until(page: Any, locator: Any, text: str | None, what: str) -> None:
    """Wait for ``locator`` to be shown (with ``text``, when given), reloading the page every 5 s (the UI does not
    poll a run's artifacts), for at most STARTUP_SECONDS."""
    from playwright.sync_api import expect

    for _ in range(STARTUP_SECONDS // 5):
        try:
            if text is None:
                expect(locator).to_be_visible(timeout=5_000)
            else:
                expect(locator).to_have_text(text, timeout=5_000)
            return
        except AssertionError:
            page.reload()
    raise AssertionError(f"{what}: not within {STARTUP_SECONDS} s (the page shows {locator.all_inner_texts()})")


@pytest.mark.browser
@pytest.mark.skipif(os.environ.get("GIL_SKIP_BROWSER") == "1", reason="GIL_SKIP_BROWSER=1")
def test_a_served_batch_shows_its_progress_moving_in_the_browser(
    prefect_ui: PrefectUI, deployments: dict[str, Any]
) -> None:
    from playwright.sync_api import expect
    from prefect.deployments import run_deployment

    root = prefect_ui.logs / "progress"
    root.mkdir()
    held = "do you sell gift cards?"  # one ticket of four held: the batch stops at 75% until it is released
    model = HeldModel(SupportModel(SCRIPTS, default=Script(answers=["None of these"])), held)
    texts = [*SCRIPTS, held]
    tickets = root / "tickets.jsonl"
    tickets.write_text("".join(json.dumps({"id": f"p{i}", "text": text}) + "\n" for i, text in enumerate(texts)))
    png = root / "prefect-ui-progress.png"
    with ScriptedOpenAIServer(responder=model) as server:
        task = write_task_file(root, server.base_url, task="progress-ui")
        parameters = {"task_file": str(task), "tickets": str(tickets), "out": f"{tickets}.results.jsonl"}
        try:
            with prefect_client(prefect_ui.api_url):
                run = run_deployment("resolve-batch/resolve-batch", parameters=parameters, timeout=0)
            with driven_chromium(1280, 720) as page:
                page.set_default_timeout(60_000)
                # The run's Artifacts tab lists its artifacts as cards; a card opens the artifact's page, which
                # draws the percentage.
                page.goto(f"{prefect_ui.url}/v2/runs/flow-run/{run.id}?tab=Artifacts")
                card = page.get_by_role("link").filter(has_text="progress-ui-batch-progress")
                reload_until(page, card, None, "the batch's progress artifact")
                card.click()
                expect(page).to_have_url(re.compile(r"/v2/artifacts/artifact/"))
                shown = page.get_by_test_id("progress-display")
                reload_until(page, shown, "Progress: 75%", "the held batch's progress")
                expect(page.get_by_role("link", name=run.name, exact=True)).to_be_visible()  # the artifact's run
                page.screenshot(path=str(png))
                model.release.set()
                reload_until(page, shown, "Progress: 100%", "the released batch's progress")
        finally:
            model.release.set()  # a failed test leaves no request of the server's waiting
        state = final_state(prefect_ui, run.id, "the batch")
    assert state.is_completed(), f"{state}\n{log_tail(prefect_ui.logs / 'serve.log')}"
    assert len(Path(f"{tickets}.results.jsonl").read_text().splitlines()) == len(texts)
    keep_screenshot(png)


@pytest.mark.browser
@pytest.mark.skipif(os.environ.get("GIL_SKIP_BROWSER") == "1", reason="GIL_SKIP_BROWSER=1")
def test_a_served_feedback_queue_is_answered_in_the_browser(prefect_ui: PrefectUI, deployments: dict[str, Any]) -> None:
    from playwright.sync_api import expect
    from prefect.deployments import run_deployment

    root = prefect_ui.logs / "feedback"
    root.mkdir()
    png = root / "prefect-ui-queue.png"
    with bad_model() as server:
        task = store_with_unconfirmed(root, server.base_url)  # 20 answers without a verdict
        # As the nightly deployment runs it (waiting for verdicts), on two answers: one queue-chosen, one random.
        parameters = {"task_file": str(task), "size": 2, "random_share": 0.5, "verdict_timeout": 900, "poll_seconds": 1}
        with prefect_client(prefect_ui.api_url):
            run = run_deployment("feedback-queue/feedback-queue", parameters=parameters, timeout=0)
            paused_run(prefect_ui, run.id, "the feedback queue's pause")
            right, wrong = queue_table(run.id)
        choices = correction_choices(load_task_file(task).task)
        # The key's answer where the form lists it (a filled template is not listed: the tree's answers and "none
        # of these" are), else the first listed one that differs from Gil's: which answers are asked varies (a
        # random share).
        listed = (KEY[wrong["request"]], *choices)
        correction = next(text for text in listed if text in choices and text != wrong["answer"])
        with driven_chromium(1280, 1900) as page:  # tall enough for the whole dialog
            page.set_default_timeout(60_000)
            page.goto(f"{prefect_ui.url}/v2/runs/flow-run/{run.id}")
            page.get_by_role("button", name="Open menu").first.click()
            page.get_by_role("menuitem", name="Resume").click()
            dialog = page.get_by_role("dialog", name="Resume Flow Run")
            for item in (right, wrong):  # above the form: each request with Gil's answer
                expect(dialog).to_contain_text(" ".join(item["request"].split()))
            rows = [dialog.locator(f"xpath=.//label[starts-with(normalize-space(), '{n}. ')]/../../..") for n in (1, 2)]
            for row, verdict in zip(rows, ("correct", "wrong"), strict=True):
                expect(row.get_by_role("button", name="Select Verdict")).to_have_text("unanswered")  # the default
                row.get_by_role("button", name="Select Verdict").click()
                page.get_by_role("option", name=verdict, exact=True).click()
                expect(row.get_by_role("button", name="Select Verdict")).to_have_text(verdict)
            rows[1].get_by_role("button", name="Select Correction").click()
            page.get_by_role("option", name=correction, exact=True).click()
            expect(rows[1].get_by_role("button", name="Select Correction")).to_have_text(correction)
            # Every scrolled box back at its top left: the long correction scrolls its row sideways.
            dialog.evaluate(
                "box => [box, ...box.querySelectorAll('*')]"
                ".forEach(element => { element.scrollTop = 0; element.scrollLeft = 0 })"
            )
            page.screenshot(path=str(png))
            resume_through_the_form(prefect_ui, dialog, run.id)
        state = final_state(prefect_ui, run.id, "the answered queue")
    assert state.is_completed(), f"{state}\n{log_tail(prefect_ui.logs / 'serve.log')}"
    keep_screenshot(png)
    # What `gil feedback` would have stored: the two verdicts, and nothing else.
    stored = stored_verdicts(task)
    assert stored[right["trace_id"]] == ("correct", None) and stored[wrong["trace_id"]] == ("wrong", correction)
    assert len(stored) == 40 + 2


@pytest.mark.browser
@pytest.mark.skipif(os.environ.get("GIL_SKIP_BROWSER") == "1", reason="GIL_SKIP_BROWSER=1")
def test_the_savings_chart_is_drawn_in_the_browser(prefect_ui: PrefectUI, stats_artifact: tuple[Any, Any]) -> None:
    from playwright.sync_api import expect
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    run, _ = stats_artifact
    wanted = ArtifactFilter(
        key=ArtifactFilterKey(any_=["support-savings"]), flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])
    )
    with prefect_client(prefect_ui.api_url) as client:
        (artifact,) = client.read_artifacts(artifact_filter=wanted)
    png = prefect_ui.logs / "prefect-ui-savings.png"
    # The chart is an inline SVG (a data: URI) in the markdown: drawn once the image has loaded with a size.
    drawn = "() => [...document.images].some(i => i.src.startsWith('data:image/svg+xml') && i.naturalWidth > 0)"
    with driven_chromium(1280, 1000) as page:
        page.set_default_timeout(60_000)
        for url in (
            f"{prefect_ui.url}/artifacts/artifact/{artifact.id}",
            f"{prefect_ui.url}/v2/artifacts/artifact/{artifact.id}",
        ):
            page.goto(url)  # the v1 UI (the README's links), then v2 (what `gil ui` opens at /)
            page.wait_for_function(drawn)
            expect(page.get_by_role("table").first).to_contain_text("full generation")
        page.screenshot(path=str(png))
    keep_screenshot(png)
