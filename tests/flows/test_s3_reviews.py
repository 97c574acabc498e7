"""Review rounds over a store on S3 (moto's server, started here on loopback): the round reads its proposals from
the bucket, writes its review list locally beside the task file (``.gil/reviews``), and the decisions taken with
``gil review decide`` land in the review log in the bucket, where the next round reads them. The demo's local
files go to the same place, and a fresh demo refuses to empty a bucket."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from gil_core.errors import ConfigurationError
from gil_core.habits.review_log import Decision, ReviewLog
from gil_core.ontology import load_tree
from gil_core.telemetry import TelemetryStore
from tests.flows._support import write_task_file
from tests.resolver._support import ROOT, Script, support_server
from tests.telemetry._s3 import assert_no_key, bucket_in_environment, objects, s3_settings, serve_s3

pytestmark = pytest.mark.s3

EXPRESS = "Express parcels arrive on the next business day."
GIFT = "Gift cards are sold in every store and online."
runner = CliRunner()

s3_endpoint = pytest.fixture(scope="module")(serve_s3)
bucket = pytest.fixture(bucket_in_environment)  # the CLI and the flow reach it with this process's GIL_S3_*


def invoke(*arguments: str) -> str:
    result = runner.invoke(app, list(arguments))
    assert result.exit_code == 0, result.stderr
    assert_no_key(result.stdout, result.stderr)
    return result.stdout


@pytest.mark.slow  # about 10 s: a batch and its feedback over S3, then the round under Prefect
@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.filterwarnings("ignore::gil_core.ontology.TreeLintWarning")  # the promoted habit's description
def test_a_promotion_round_over_an_s3_store_lists_locally_and_its_decisions_land_in_the_bucket(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    from flows.review import promotion_round_flow

    tree_file = tmp_path / "support.yaml"
    shutil.copy(ROOT / "ontologies" / "support.yaml", tree_file)
    express = ["express shipping?", "is there express delivery?", "can I get it faster?", "next day delivery?"]
    gift = ["do you sell gift cards?", "gift card for a friend", "where to buy a gift card", "gift vouchers?"]
    scripts = {text: Script(route=["shipping"], answers=[EXPRESS]) for text in express}
    scripts |= {text: Script(route=["billing"], answers=[GIFT]) for text in gift}
    store_uri = f"s3://{bucket}/gil/store"
    with support_server(scripts) as server:  # each answer generated four times, all confirmed: two proposals
        task = write_task_file(
            tmp_path, server.base_url, tree=str(tree_file), contract="text", memory_threshold=None, store=store_uri
        )
        tickets = tmp_path / "tickets.jsonl"
        tickets.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(scripts)))
        invoke("resolve-batch", str(tickets), "--out", str(tmp_path / "r.jsonl"), "-t", str(task))
    results = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text("".join(json.dumps({"trace_id": r["trace_id"], "correct": True}) + "\n" for r in results))
    invoke("feedback", str(verdicts), "-t", str(task))

    published = asyncio.run(promotion_round_flow(str(task)))
    review_file = tmp_path / ".gil" / "reviews" / "support-promotion.yaml"
    assert published == {"items": 2, "file": str(review_file)}
    listed = yaml.safe_load(review_file.read_text(encoding="utf-8"))
    by_text = {item["text"]: item["id"] for item in listed["items"]}
    assert set(by_text) == {EXPRESS, GIFT} and listed["at_index"] == 8
    assert not list(tmp_path.rglob("s3:*")) and not Path("s3:").exists()  # no folder made of a folded URI
    assert not (tmp_path / "store").exists()

    accept, reject = by_text[EXPRESS], by_text[GIFT]
    invoke("review", "decide", "promotion", accept, "accepted", "--note", "asked daily", "-t", str(task))
    invoke("review", "decide", "promotion", reject, "rejected", "--note", "seasonal", "-t", str(task))

    fresh_reader = TelemetryStore(store_uri, s3=s3_settings(s3_endpoint))
    decisions = ReviewLog(fresh_reader).decisions("support", "promotion")
    assert {item: (entry.decision, entry.note) for item, entry in decisions.items()} == {
        accept: (Decision.ACCEPTED, "asked daily"),
        reject: (Decision.REJECTED, "seasonal"),
    }
    assert any(name.startswith("reviews/") for name in objects(s3_settings(s3_endpoint), bucket, "gil/store"))
    assert load_tree(tree_file).option(accept).text == EXPRESS  # the tree file is local and changed in place

    # The next round, here through the CLI, reads the log back from the bucket: neither item is proposed again.
    again = json.loads(invoke("review", "promote", "-t", str(task), "--json"))
    assert again["items"] == [] and again["file"] == str(review_file)


def test_the_demo_keeps_its_files_beside_the_task_file_and_never_empties_a_bucket(tmp_path: Path) -> None:
    from flows.demo import prepare

    task = write_task_file(tmp_path, "http://127.0.0.1:9/v1", store="s3://bucket/gil/store")
    with pytest.raises(ConfigurationError, match=r"s3://bucket/gil/store is not a local folder: run with --no-fresh"):
        prepare(task, fresh=True)
    assert prepare(task, fresh=False).work == tmp_path / ".gil" / "demo-files"
    assert (tmp_path / ".gil" / "demo-files").is_dir()

    local = write_task_file(tmp_path, "http://127.0.0.1:9/v1")  # a local store: beside it, as before
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "old.parquet").write_text("old")
    assert prepare(local, fresh=True).work == tmp_path / "demo-files" and not (tmp_path / "store").exists()
