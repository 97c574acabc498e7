"""Names that look like paths: a task named ``../../x``, an absolute path, ``a/b``, ``..``, with a NUL, or longer
than a file name may be, through every command that writes a file named after something (review lists, the
learned judge's states, the operation log), on a local store and on ``s3://`` (moto's server on loopback).
Nothing is written outside the store and its reviews folder, each name keeps its own files, and the store's side
folders refuse such names outright."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from gil_core.errors import TelemetryError
from gil_core.reviews import review_file_name, safe_name
from gil_core.telemetry import TelemetryStore
from tests.flows._support import write_task_file
from tests.reliability._support import write_jsonl
from tests.resolver._support import Script, support_server
from tests.telemetry._s3 import bucket_in_environment, objects, s3_settings, serve_s3

pytestmark = pytest.mark.reliability

runner = CliRunner()
REFUND_QUESTION = "where is my refund?"
PATH_NAMES = ["../../x", "{outside}/etc", "a/b", "..", "nul\x00byte", "x" * 300]


def gil(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.stderr
    return result.stdout


def run_every_writer(folder: Path, base_url: str, name: str, **changes: object) -> Path:
    """A batch, its feedback (the learned judge refits and saves its state), stats and a promotion round for the
    task ``name``, from a task file in ``folder``; the review list's path."""
    task = write_task_file(folder, base_url, task=name, learned_reflex={"precision": 0.9}, **changes)
    tickets = write_jsonl(folder / "tickets.jsonl", [{"id": "t1", "text": REFUND_QUESTION}])
    results = folder / "results.jsonl"
    gil("resolve-batch", str(tickets), "--out", str(results), "-t", str(task))
    (result,) = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    verdicts = write_jsonl(folder / "verdicts.jsonl", [{"trace_id": result["trace_id"], "correct": True}])
    gil("feedback", str(verdicts), "-t", str(task))
    gil("stats", "-t", str(task))
    return Path(json.loads(gil("review", "promote", "-t", str(task), "--json"))["file"])


def files_under(root: Path) -> Iterator[Path]:
    return (path for path in root.rglob("*") if path.is_file())


@pytest.fixture
def server() -> Iterator[str]:
    with support_server({REFUND_QUESTION: Script(route=["billing", "refund status"])}) as scripted:
        yield scripted.base_url


def test_a_task_named_like_a_path_writes_only_inside_its_store_and_reviews_folder(tmp_path: Path, server: str) -> None:
    """Each name in its own folder three levels down; afterwards every file under the test's folder is in that
    folder's store, memory or reviews folder (the learned judge's states and the operation log in the store), and
    each review list is the file ``review_file_name`` gives, naming its task whole."""
    lists: dict[str, Path] = {}
    for index, pattern in enumerate(PATH_NAMES):
        name = pattern.format(outside=tmp_path / "outside")
        folder = tmp_path / f"case{index}" / "deep" / "work"
        folder.mkdir(parents=True)
        listed = run_every_writer(folder, server, name, client={"log_path": str(folder / "store")})
        assert listed == folder / "reviews" / review_file_name(name, "promotion"), name
        assert yaml.safe_load(listed.read_text(encoding="utf-8"))["task"] == name
        assert list((folder / "store" / "learned").iterdir()), "the learned judge saved no state"
        assert list((folder / "store" / "operation_log").iterdir()), "the operation log wrote nothing"
        lists[name] = listed

    allowed = {"store", "memory", "reviews", "task.yaml", "tickets.jsonl", "results.jsonl", "verdicts.jsonl"}
    for path in files_under(tmp_path):
        case, deep, work, first = path.relative_to(tmp_path).parts[:4]
        assert case.startswith("case") and (deep, work) == ("deep", "work") and first in allowed, path
    assert not (tmp_path / "outside").exists()
    assert len(set(lists.values())) == len(PATH_NAMES)  # no two names share a list


@pytest.mark.s3
def test_a_task_named_like_a_path_writes_only_under_its_s3_prefix(
    tmp_path: Path, server: str, s3_endpoint: str, bucket: str
) -> None:
    """The same writers over ``s3://bucket/gil/store``: every object is under the prefix, in a table's folder or
    the learned judge's, and no key holds a name's path (only its hash)."""
    names = ["../../x", "/etc", "a/b", "nul\x00byte", "x" * 300]
    for index, name in enumerate(names):
        folder = tmp_path / f"case{index}"
        folder.mkdir()
        listed = run_every_writer(folder, server, name, store=f"s3://{bucket}/gil/store")
        assert listed == folder / ".gil" / "reviews" / review_file_name(name, "promotion")
    from pyarrow import fs

    settings = s3_settings(s3_endpoint)
    listed_all = settings.filesystem(bucket).get_file_info(fs.FileSelector(bucket, recursive=True))
    everything = [info.path for info in listed_all if info.type == fs.FileType.File]
    inside = objects(settings, bucket, "gil/store")
    assert len(everything) == len(inside) > 0 and all(key.startswith(f"{bucket}/gil/store/") for key in everything)
    learned = [key for key in inside if key.startswith("learned/")]
    assert len({key.split("/")[1] for key in learned}) == len(names)  # one folder per task, named by a hash
    locks = [key for key in inside if key.startswith("locks/")]
    assert sorted(locks) == sorted(f"locks/batch-{safe_name(name)}.json" for name in names)  # a batch's turn each
    for key in inside:
        parts = key.split("/")
        assert ".." not in parts and "etc" not in parts and "\x00" not in key and "a/b" not in key, key


s3_endpoint = pytest.fixture(scope="module")(serve_s3)
bucket = pytest.fixture(bucket_in_environment)


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("part", ["../x", "..", ".", "/etc", "a/b", "nul\x00", "x" * 129, ""])
def test_a_side_folder_of_the_store_refuses_a_part_that_is_no_plain_name(
    where: str, part: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if where == "s3":
        request.applymarker(pytest.mark.s3)
        location: str | Path = f"s3://{request.getfixturevalue('bucket')}/gil/store"
    else:
        location = tmp_path / "store"
    with pytest.raises(TelemetryError, match="not a side folder of the store"):
        TelemetryStore(location).side_folder("learned", part)


def test_every_artifact_key_is_one_prefect_accepts_whatever_the_task_name() -> None:
    """Prefect refuses an artifact key with anything but lower-case letters, digits and dashes: a task's keys
    (review rounds, stats, the learned reflex) are the task name where it is one already, else escaped, and no two
    names share a key."""
    from prefect.types.names import raise_on_name_alphanumeric_dashes_only

    from flows._prefect import artifact_key
    from flows.review import review_artifact_key
    from gil_core.habits.review_log import ReviewKind
    from gil_core.reviews import ReviewList

    names = [*PATH_NAMES, "support", "Support", "support_tickets", "support tickets", "é"]
    keys = {review_artifact_key(ReviewList(ReviewKind.PROMOTION, name, [])) for name in names}
    assert len(keys) == len(names) and "support-promotion" in keys
    others = {artifact_key(name, kind) for name in names for kind in ("stats", "learned-reflex")}
    assert len(others) == 2 * len(names) and "support-stats" in others
    for key in keys | others:
        raise_on_name_alphanumeric_dashes_only(key, "key")
