"""One error contract, at the library's edge (gil_core.errors, module doc): a file system, Polars, pyarrow or HTTP
failure met by a public entry point leaves ``gil_core`` as a ``GilError`` naming what failed and where, the
library's exception as its cause. Each test makes the library fail for real: a file where a folder should be, a
folder where a file should be, a file cut short, a server that drops the connection. And a failure to learn from
feedback is recorded where every process sees it, and counted by ``gil stats``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.batch import (
    Ticket,
    Verdict,
    count_lines,
    iter_tickets,
    read_tickets,
    read_verdicts,
    resolve_batch,
    write_results,
)
from gil_core.batch_feedback import apply_verdicts
from gil_core.batch_lock import hold_batch_turn
from gil_core.client.oplog.jsonl import OPERATION_LOG_FOLDER, JsonLinesOperationLog
from gil_core.errors import BatchFileError, ModelUnavailableError, TelemetryError, TreeFileError
from gil_core.llm import Message, OpenAICompatibleChatModel
from gil_core.ontology import load_tree, write_tree
from gil_core.reviews import write_tree_version
from gil_core.runtime import load_fitted_energy, open_runtime
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.reliability._support import write_jsonl
from tests.resolver._support import Script, support_server

pytestmark = pytest.mark.reliability

MESSAGES: list[Message] = [{"role": "user", "content": "where is my refund?"}]


# -- the telemetry store in a local folder ---------------------------------------------------------------------


def test_a_store_whose_folder_is_a_file_fails_every_read_with_a_telemetry_error_naming_the_table(
    tmp_path: Path,
) -> None:
    """The store's root is a file (a broken mount, say): reads, scans, stats, the trace look-up and the check fail
    with the table and the store named, the ``OSError`` as the cause."""
    root = tmp_path / "store"
    root.write_text("not a folder", encoding="utf-8")
    store = TelemetryStore(root)
    for attempt in (
        lambda: store.read("traces"),
        lambda: store.scan("traces"),
        lambda: store.stats("support", 10),
        lambda: store.traced("support", ["t1"]),
        lambda: store.check(),
    ):
        with pytest.raises(TelemetryError, match=r"table 'traces' at .*store: could not") as caught:
            attempt()
        assert str(root) in str(caught.value)
        assert isinstance(caught.value.__cause__, NotADirectoryError)


def test_a_folder_in_a_data_files_place_fails_a_compaction_naming_the_table(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    for index in range(2):
        store.append("store_meta", [{"key": f"k{index}", "value": "v"}])
    (tmp_path / "store" / "store_meta" / "00000000000000000001-1-00000000.parquet").mkdir()
    with pytest.raises(TelemetryError, match=r"table 'store_meta' at .*: could not compact") as caught:
        TelemetryStore(tmp_path / "store").compact("store_meta")
    assert "00000000000000000001-1-00000000.parquet" in str(caught.value)
    assert isinstance(caught.value.__cause__, IsADirectoryError)


def test_a_scan_collected_over_a_file_cut_short_meanwhile_is_a_telemetry_error_naming_the_store(
    tmp_path: Path,
) -> None:
    """``rescanning`` reads again when a file went (a compaction); a file that is there but no longer decodes is
    no race: it ends in one ``TelemetryError`` naming the store, Polars' error as the cause."""
    root = tmp_path / "store"
    store = TelemetryStore(root)
    for index in range(3):
        store.append("store_meta", [{"key": f"k{index}", "value": "v"}])
    attempts: list[int] = []

    def read() -> pl.DataFrame:
        attempts.append(1)
        frame = store.scan("store_meta")  # every footer checked: all three files are sound
        victim = sorted((root / "store_meta").glob("*.parquet"))[0]
        data = victim.read_bytes()
        victim.write_bytes(data[: len(data) // 2])
        return frame.collect()

    with pytest.raises(TelemetryError, match=r"the store at .*store: could not collect a scan") as caught:
        store.rescanning(read)
    assert isinstance(caught.value.__cause__, pl.exceptions.PolarsError)
    assert attempts == [1]  # not taken for a race and read again


# -- ticket and verdict files ----------------------------------------------------------------------------------


def test_a_folder_in_a_ticket_or_verdict_files_place_is_an_input_file_error_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "tickets.jsonl"
    folder.mkdir()
    for attempt in (
        lambda: read_tickets(folder),
        lambda: list(iter_tickets(folder)),
        lambda: read_verdicts(folder),
        lambda: count_lines(folder),
    ):
        with pytest.raises(BatchFileError, match="Is a directory") as caught:
            attempt()
        assert caught.value.path == str(folder) and str(caught.value).startswith(f"{folder}: cannot read the file")
        assert isinstance(caught.value.__cause__, IsADirectoryError)
    missing = tmp_path / "absent.jsonl"
    with pytest.raises(BatchFileError, match="No such file or directory") as gone:
        read_verdicts(missing)
    assert gone.value.path == str(missing)


def test_a_parquet_ticket_file_cut_short_is_an_input_file_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "tickets.parquet"
    pl.DataFrame({"id": [f"t{index}" for index in range(100)], "text": ["where is my refund?"] * 100}).write_parquet(
        path
    )
    assert len(read_tickets(path)[0]) == 100 and count_lines(path) == 100
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    for attempt in (lambda: read_tickets(path), lambda: count_lines(path)):
        with pytest.raises(BatchFileError, match=r"not a parquet file|magic bytes") as caught:
            attempt()
        assert caught.value.path == str(path) and str(path) in str(caught.value)


def test_a_bad_line_of_a_readable_file_is_still_reported_where_it_stands_not_raised(tmp_path: Path) -> None:
    """The wrapping is the file's own failure only: a line that is not JSON stays a ``BadInput`` and the rest of
    the file runs."""
    path = write_jsonl(tmp_path / "tickets.jsonl", [{"id": "a", "text": "hello"}])
    with path.open("a", encoding="utf-8") as handle:
        handle.write("{not json\n")
    tickets, bad = read_tickets(path)
    assert [ticket.id for ticket in tickets] == ["a"] and [item.where for item in bad] == [f"{path}:2"]


def test_a_results_file_that_cannot_be_written_is_a_batch_file_error_naming_it(tmp_path: Path) -> None:
    task = load_task_file(write_task_file(tmp_path, "http://127.0.0.1:9/v1")).task
    out = tmp_path / "results.jsonl"
    out.mkdir()
    with pytest.raises(BatchFileError, match="cannot write the results") as caught:
        write_results(TelemetryStore(tmp_path / "store"), task, [Ticket("a", "hello")], out)
    assert caught.value.path == str(out) and isinstance(caught.value.__cause__, IsADirectoryError)
    assert out.is_dir() and not [path for path in tmp_path.iterdir() if path.name.endswith(".tmp")]


# -- the batch turn and the tree file ---------------------------------------------------------------------------


def test_a_batch_turn_on_a_store_whose_folder_is_a_file_is_a_telemetry_error_naming_the_lock(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.write_text("not a folder", encoding="utf-8")
    with (
        pytest.raises(
            TelemetryError, match=r"batch turn of task 'support': cannot lock .*batch-support\.lock"
        ) as caught,
        hold_batch_turn(root, "support", wait_s=0),
    ):
        pass
    assert str(root) in str(caught.value) and isinstance(caught.value.__cause__, NotADirectoryError)


def test_a_tree_written_where_a_folder_stands_is_a_tree_file_error_naming_the_file(tmp_path: Path) -> None:
    tree = load_tree(Path(__file__).resolve().parents[2] / "ontologies" / "support.yaml")
    target = tmp_path / "tree.yaml"
    target.mkdir()
    with pytest.raises(TreeFileError, match="cannot write the tree file") as caught:
        write_tree(tree, target)
    assert caught.value.path == str(target) and str(caught.value).startswith(f"{target}: ")
    write_tree(tree, tmp_path / "elsewhere.yaml")  # the same tree where nothing is in the way
    assert load_tree(tmp_path / "elsewhere.yaml").root.id == tree.root.id


def test_a_tree_version_that_cannot_be_written_is_a_tree_file_error_naming_it(tmp_path: Path) -> None:
    """The folder beside the tree file is a file (the review's new version has nowhere to go)."""
    tree = load_tree(Path(__file__).resolve().parents[2] / "ontologies" / "support.yaml")
    (tmp_path / "trees").write_text("not a folder", encoding="utf-8")
    with pytest.raises(TreeFileError, match="cannot write the tree file") as caught:
        write_tree_version(tree, tmp_path / "trees" / "support.yaml")
    assert caught.value.path == str(tmp_path / "trees" / "support.v2.yaml")
    assert isinstance(caught.value.__cause__, NotADirectoryError)


# -- a stored value that does not read ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["{not json", '{"no_such_coefficient": 1.0}', '{"fixed": "a lot"}'])
def test_a_stored_energy_model_that_does_not_read_is_a_telemetry_error_naming_the_key(
    tmp_path: Path, value: str
) -> None:
    store = TelemetryStore(tmp_path / "store")
    store.append("store_meta", [{"key": "energy_model", "value": value}])
    with pytest.raises(TelemetryError, match=r"table 'store_meta' at .*: key 'energy_model' holds no energy model"):
        load_fitted_energy(TelemetryStore(tmp_path / "store"))


# -- the operation log -----------------------------------------------------------------------------------------


def test_an_operation_log_file_that_cannot_be_read_is_a_telemetry_error_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / OPERATION_LOG_FOLDER
    folder.mkdir()
    in_the_way = folder / "00000000000000000001-1-00000000.jsonl"
    in_the_way.mkdir()
    with pytest.raises(TelemetryError, match=r"operation log: cannot read .*00000000000000000001") as caught:
        JsonLinesOperationLog(tmp_path).entries()
    assert str(in_the_way) in str(caught.value) and isinstance(caught.value.__cause__, IsADirectoryError)
    in_the_way.rmdir()
    in_the_way.write_bytes(b"\xff\xfe not UTF-8\n")
    with pytest.raises(TelemetryError, match="UnicodeDecodeError"):
        JsonLinesOperationLog(tmp_path).stats()


# -- the HTTP adapter -------------------------------------------------------------------------------------------


async def test_a_server_that_drops_the_connection_is_a_model_error_naming_the_endpoint() -> None:
    """The server reads the request, then resets the connection (TCP RST, no reply): httpx's transport error
    leaves as ``ModelUnavailableError`` naming the URL."""
    with ScriptedOpenAIServer(fault_mix={"reset": 1.0}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m", max_attempts=1) as chat:
            with pytest.raises(ModelUnavailableError) as caught:
                await chat.complete(MESSAGES, max_tokens=8)
        assert server.faults["reset"] == 1
    assert server.base_url in str(caught.value) and caught.value.endpoint.startswith(server.base_url)


# -- a verdict memory failed to learn ---------------------------------------------------------------------------

REFUND_QUESTION = "where is my refund?"


def gil_stats(task_file: Path, *, as_json: bool) -> str:
    """``gil stats`` run through its entry point in this process: a store object of its own."""
    result = CliRunner().invoke(app, ["stats", "-t", str(task_file), *(["--json"] if as_json else [])])
    assert result.exit_code == 0, result.stderr
    return result.stdout


async def give_verdicts(task_file: Path, tickets: list[Ticket]) -> int:
    """Resolve ``tickets``, confirm each answer; the verdicts memory did not learn (``FeedbackReport``)."""
    loaded = load_task_file(task_file)
    async with open_runtime(loaded) as runtime:
        report = await resolve_batch(runtime.resolver, loaded.task, tickets, concurrency=1)
        verdicts = [Verdict(report.trace_ids[ticket.id], True) for ticket in tickets]
        return (await apply_verdicts(runtime.resolver, loaded.task, verdicts)).not_learned


@pytest.mark.slow
def test_verdicts_memory_failed_to_learn_are_counted_by_gil_stats_until_a_relearn_or_rebuild(tmp_path: Path) -> None:
    """Memory's folder is a file (a broken mount): every memory write during feedback fails. The verdicts are
    stored, and each failure is recorded in the store, so ``gil stats`` (another store object, as another process
    has) counts them, in its JSON and in its text. A rerun of two of the verdicts once memory is back relearns
    them (the count drops to 1, in a new runtime that knew nothing of the failures), and ``gil rebuild-memory``
    catches up with the last."""
    with support_server({REFUND_QUESTION: Script(route=["billing", "refund status"])}) as chat:
        task_file = write_task_file(tmp_path, chat.base_url)
        (tmp_path / "memory").write_text("not a directory", encoding="utf-8")
        tickets = [Ticket(f"t{index}", REFUND_QUESTION) for index in range(3)]
        assert asyncio.run(give_verdicts(task_file, tickets)) == 3

        document = json.loads(gil_stats(task_file, as_json=True))
        assert document["memory_not_learned"] == 3
        assert "memory did not learn 3 verdicts" in gil_stats(task_file, as_json=False)
        rows = TelemetryStore(tmp_path / "store").read("unlearned_verdicts")
        assert rows.height == 3 and not any(rows["learned"]) and set(rows["task"]) == {"support"}
        assert all("LanceDB store" in reason for reason in rows["reason"])  # what failed, and where

        (tmp_path / "memory").unlink()  # the mount is back, empty
        assert asyncio.run(give_verdicts(task_file, tickets[:2])) == 0  # stored already: relearnt
        assert json.loads(gil_stats(task_file, as_json=True))["memory_not_learned"] == 1
        assert "memory did not learn 1 verdict:" in gil_stats(task_file, as_json=False)

    result = CliRunner().invoke(app, ["rebuild-memory", "-t", str(task_file), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(gil_stats(task_file, as_json=True))["memory_not_learned"] == 0
    assert "memory did not learn" not in gil_stats(task_file, as_json=False)
