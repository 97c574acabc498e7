"""TelemetryStore: records become rows with the reference's JSON, writes are validated, keys supersede,
compaction keeps every row exactly once (also when it was interrupted)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gil_core.errors import SchemaViolationError, TelemetryError
from gil_core.telemetry import (
    COLUMNS,
    TABLES,
    CallRecord,
    CandidateShown,
    TelemetryStore,
    TraceRecord,
    TraceSink,
)
from tests._compacting import compacting

AT = datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=UTC)


def make_call(call_id: str = "c1", trace_id: str | None = "t1", **changes: Any) -> CallRecord:
    call = CallRecord(
        call_id=call_id,
        trace_id=trace_id,
        created_at=AT,
        role="judge",
        model="smollm2",
        node_id="root",
        layer=1,
        prompt_tokens=120,
        cached_tokens=100,
        completion_tokens=1,
        latency_ms=12.5,
        gpu_prompt_ms=3.0,
        gpu_predicted_ms=1.5,
        content="B",
        first_token="B",
        top_logprobs=(("B", -0.1), (" A", -2.5), ("Z", None)),
        distribution={"환불": 0.9, "none": 0.1},
        label_mass=0.98,
        confidence=0.9,
        outcome="accept",
        energy=24.0,
        raw_response='{"choices":[]}',
        candidates=(
            CandidateShown(id=None, shown_as="A", label="해당 없음"),
            CandidateShown(id="refund", shown_as="B", label="환불", description="돈을 돌려받기", answer="5일"),
        ),
    )
    return replace(call, **changes)


def make_trace(trace_id: str = "t1", **changes: Any) -> TraceRecord:
    trace = TraceRecord(
        trace_id=trace_id,
        created_at=AT,
        task="support",
        state="환불은 언제 되나요?",
        mode="habit/answer",
        path=(
            {
                "node": "root",
                "layer": 1,
                "chosen": "billing",
                "p": 0.9,
                "outcome": "accept",
                "none_prob": 0.02,
            },
            {"node": "billing", "layer": 2, "chosen": "refund", "p": 0.8, "outcome": "accept"},
        ),
        output="5일 안에 환불됩니다.",
        confidence=0.8,
        energy=48.0,
        recall={"source": "t0", "similarity": 0.5, "threshold": 0.8, "hit": False, "error": None},
    )
    return replace(trace, **changes)


@pytest.fixture
def store(tmp_path: Path) -> TelemetryStore:
    return TelemetryStore(tmp_path / "store")


def parquet_files(store: TelemetryStore, table: str) -> list[Path]:
    return sorted((store.root / table).glob("*.parquet"))


def review(item_id: str, **changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "task": "support",
        "reviewed_at": AT,
        "kind": "promotion",
        "item_id": item_id,
        "decision": "accept",
    }
    return {**row, **changes}


def test_the_store_is_a_trace_sink(store: TelemetryStore) -> None:
    assert isinstance(store, TraceSink)
    assert store.tables() == tuple(TABLES)


def test_a_recorded_trace_and_its_calls_read_back_with_the_reference_json(store: TelemetryStore) -> None:
    store.record_trace(make_trace(), [make_call()])

    trace = store.read("traces").row(0, named=True)
    assert trace["created_at"] == AT
    assert trace["state"] == "환불은 언제 되나요?"
    assert json.loads(trace["path"]) == [dict(step) for step in make_trace().path]
    assert trace["recall"] == '{"source":"t0","similarity":0.5,"threshold":0.8,"hit":false}'  # error: null, left out
    assert trace["feedback_verdict"] is None

    call = store.read("calls").row(0, named=True)
    assert call["trace_id"] == "t1"
    assert call["top_logprobs"] == (
        '[{"token":"B","logprob":-0.1},{"token":" A","logprob":-2.5},{"token":"Z","logprob":null}]'
    )
    assert call["distribution"] == '{"환불":0.9,"none":0.1}'  # non-ASCII kept, compact separators
    assert json.loads(call["candidates"]) == [
        {"id": None, "shown_as": "A", "label": "해당 없음", "description": "", "answer": None},
        {"id": "refund", "shown_as": "B", "label": "환불", "description": "돈을 돌려받기", "answer": "5일"},
    ]
    assert "\\u" not in call["candidates"]
    assert (call["prompt_tokens"], call["cached_tokens"], call["energy"]) == (120, 100, 24.0)
    assert list(store.read("calls").columns) == list(COLUMNS["calls"])


def test_a_call_without_logprobs_or_distribution_stores_empty_json_and_null(store: TelemetryStore) -> None:
    store.record_calls([make_call(role="embed", top_logprobs=(), distribution=None, candidates=())])
    call = store.read("calls").row(0, named=True)
    assert (call["top_logprobs"], call["distribution"], call["candidates"]) == ("[]", None, "[]")


def test_timestamps_are_stored_as_utc_microseconds(store: TelemetryStore) -> None:
    seoul = AT.astimezone(timezone(timedelta(hours=9)))
    store.record_trace(make_trace(created_at=seoul))
    created_at = store.read("traces").get_column("created_at")
    assert created_at.dtype == pl.Datetime("us", "UTC")
    assert created_at.item() == AT


def test_recording_a_trace_again_supersedes_it(store: TelemetryStore) -> None:
    """Feedback rewrites the trace row; readers see only the latest, before and after compaction."""
    store.record_trace(make_trace("t1"))
    store.record_trace(make_trace("t2"))
    store.record_trace(make_trace("t1", feedback_verdict="wrong", feedback_correction="3일"))

    def verdicts() -> dict[str, str | None]:
        frame = store.read("traces")
        return dict(zip(frame["trace_id"], frame["feedback_verdict"], strict=True))

    assert verdicts() == {"t1": "wrong", "t2": None}
    store.compact("traces")
    assert verdicts() == {"t1": "wrong", "t2": None}
    store.record_trace(make_trace("t1", feedback_verdict="correct"))
    assert verdicts() == {"t1": "correct", "t2": None}


def test_within_one_append_the_last_row_per_key_wins(store: TelemetryStore) -> None:
    store.append("store_meta", [{"key": "restricted", "value": "0"}, {"key": "restricted", "value": "1"}])
    assert store.read("store_meta").rows() == [("restricted", "1")]


def test_a_log_table_keeps_every_row(store: TelemetryStore) -> None:
    store.append("reviews", [review("p1"), review("p1", decision="reject")])
    assert store.read("reviews")["decision"].to_list() == ["accept", "reject"]


@pytest.mark.parametrize(
    ("table", "rows", "named"),
    [
        ("calls", None, "role"),  # role "oracle"
        ("calls", None, "prompt_tokens"),  # negative
        ("traces", [{"trace_id": "t", "created_at": AT, "oracle": 1}], "oracle"),  # unknown column
        ("traces", [{"trace_id": "t", "created_at": AT}], "task"),  # missing required column
        ("store_meta", [{"key": "k", "value": 1}], "value"),  # wrong type
        ("run_configs", [{"task": "t", "created_at": AT, "config": "{not json"}], "config"),
        ("reviews", [review("p", reviewed_at=datetime(2026, 1, 1))], "reviewed_at"),  # naive datetime
    ],
)
def test_a_row_that_does_not_fit_raises_naming_the_table_and_writes_nothing(
    store: TelemetryStore, table: str, rows: list[Mapping[str, Any]] | None, named: str
) -> None:
    with pytest.raises(SchemaViolationError) as caught:
        if rows is not None:
            store.append(table, rows)
        elif named == "role":
            store.record_calls([make_call(role="oracle")])  # type: ignore[arg-type]
        else:
            store.record_calls([make_call(prompt_tokens=-3)])
    assert caught.value.table == table
    assert named in str(caught.value)
    assert parquet_files(store, table) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"feedback_verdict": "maybe"},
        {"confidence": 1.5},
        {"energy": -1.0},
        {"path": ({"p": float("nan")},)},  # not JSON
        {"extra": {"task": "other"}},  # extra may not overwrite a column
    ],
)
def test_trace_values_outside_the_contract_are_rejected(store: TelemetryStore, changes: dict[str, Any]) -> None:
    with pytest.raises(SchemaViolationError) as caught:
        store.record_trace(make_trace(**changes))
    assert caught.value.table == "traces"


def test_a_label_mass_a_hair_above_one_is_float_noise_not_an_error(store: TelemetryStore) -> None:
    store.record_calls([make_call(label_mass=1.0 + 1e-12)])
    assert store.read("calls").height == 1


def test_missing_nullable_columns_are_filled_with_null(store: TelemetryStore) -> None:
    store.append("reviews", [review("p1")])  # no "note"
    store.append("node_stats", [{"scope": "s", "node_id": "root", "hits": 1, "accepts": 1, "exits": 0}])
    assert store.read("reviews")["note"].to_list() == [None]
    assert store.read("node_stats")["last_used_at"].to_list() == [None]


def test_a_dataframe_is_appended_after_lossless_dtype_fixes(store: TelemetryStore) -> None:
    frame = pl.DataFrame(
        {
            "task": ["support"],
            "reviewed_at": pl.Series([AT]).dt.cast_time_unit("ns").dt.convert_time_zone("Asia/Seoul"),
            "kind": ["promotion"],
            "item_id": ["p1"],
            "decision": ["accept"],
            "note": [None],  # dtype Null
        }
    )
    store.append("reviews", frame)
    assert store.read("reviews").row(0) == ("support", AT, "promotion", "p1", "accept", None)


def test_a_dataframe_with_a_wrong_dtype_is_rejected(store: TelemetryStore) -> None:
    frame = pl.DataFrame({"task": ["t"], "at_index": [1.0]})
    with pytest.raises(SchemaViolationError, match="at_index"):
        store.append("promotion_rounds", frame)


@pytest.mark.parametrize("table", list(TABLES))
def test_an_unwritten_table_reads_empty_with_its_schema(store: TelemetryStore, table: str) -> None:
    expected = {name: column.dtype.type for name, column in TABLES[table].to_schema().columns.items()}
    for frame in (store.read(table), store.scan(table).collect()):
        assert frame.height == 0
        assert dict(frame.schema) == expected


def test_an_unknown_table_is_an_error(store: TelemetryStore) -> None:
    with pytest.raises(TelemetryError, match="oracles"):
        store.read("oracles")
    with pytest.raises(TelemetryError, match="oracles"):
        store.append("oracles", [{"a": 1}])


def test_an_empty_append_writes_no_file(store: TelemetryStore) -> None:
    store.append("reviews", [])
    store.record_calls([])
    assert parquet_files(store, "reviews") == [] and parquet_files(store, "calls") == []


def test_each_append_is_one_file_and_scan_matches_read(store: TelemetryStore) -> None:
    for index in range(5):
        store.append("reviews", [review(f"p{index}")])
    assert len(parquet_files(store, "reviews")) == 5
    assert store.scan("reviews").collect().equals(store.read("reviews"))
    assert store.read("reviews")["item_id"].to_list() == [f"p{index}" for index in range(5)]  # write order


def test_readers_ignore_dot_files(store: TelemetryStore) -> None:
    """Temporary files of a writer killed mid-write are dot-names: never read, never an error."""
    store.append("reviews", [review("p1")])
    (store.root / "reviews" / ".00000000000000000001-1-dead.parquet.tmp").write_bytes(b"PAR1 half")
    (store.root / "reviews" / ".hidden.parquet").write_bytes(b"garbage")
    assert store.read("reviews")["item_id"].to_list() == ["p1"]


def test_files_written_before_a_column_existed_read_it_as_null(store: TelemetryStore) -> None:
    """Columns are added over time: an older file without one still reads."""
    store.append("reviews", [review("p1", note="new")])
    older = store.read("reviews").drop("note").with_columns(_seq=pl.lit(1, pl.Int64), item_id=pl.lit("p0"))
    older.write_parquet(store.root / "reviews" / "00000000000000000001-1-old.parquet")
    assert store.read("reviews").select("item_id", "note").rows() == [("p0", None), ("p1", "new")]


def test_compaction_keeps_every_row_exactly_once(store: TelemetryStore) -> None:
    for index in range(12):
        store.append("reviews", [review(f"p{index}"), review(f"q{index}")])
        store.record_trace(make_trace(f"t{index % 5}", energy=float(index)), [make_call(f"c{index}")])
    before = {table: store.read(table) for table in ("reviews", "traces", "calls")}

    assert store.compact("reviews") == 12
    assert store.compact("traces") == 12
    assert store.compact("calls") == 12
    for table, frame in before.items():
        assert store.read(table).equals(frame)
        assert len(parquet_files(store, table)) == 1
    assert store.read("traces").height == 5
    assert store.read("reviews").height == 24
    assert store.compact("reviews") == 0  # one file: nothing to merge

    store.append("reviews", [review("late")])
    assert store.compact("reviews") == 2  # the compacted file and the new one
    assert store.read("reviews").height == 25


def test_the_compacted_file_names_the_files_it_replaces(store: TelemetryStore) -> None:
    for index in range(3):
        store.append("reviews", [review(f"p{index}")])
    sources = [path.name for path in parquet_files(store, "reviews")]
    store.compact("reviews")
    (merged,) = parquet_files(store, "reviews")
    metadata = pq.read_metadata(merged).metadata
    assert json.loads(metadata[b"gil.replaces"]) == sources
    first, last = (int(name.split("-")[0]) for name in (sources[0], sources[-1]))
    assert json.loads(metadata[b"gil.seq_range"]) == [first, last]  # the _seq it holds, for readers' order check


def test_a_compaction_killed_before_its_deletes_still_reads_each_row_once(
    store: TelemetryStore, tmp_path: Path
) -> None:
    """Simulated by restoring the sources after the compacted file was renamed into place."""
    for index in range(4):
        store.append("reviews", [review(f"p{index}")])
        store.record_trace(make_trace(f"t{index}"))
    saved = tmp_path / "saved"
    shutil.copytree(store.root, saved)
    expected = {table: store.read(table) for table in ("reviews", "traces")}
    store.compact("reviews")
    store.compact("traces")
    for table in ("reviews", "traces"):
        for source in (saved / table).glob("*.parquet"):
            shutil.copy2(source, store.root / table / source.name)
        assert len(parquet_files(store, table)) == 5  # the merged file and its four leftovers

        assert store.read(table).equals(expected[table])
        assert TelemetryStore(store.root).read(table).equals(expected[table])  # a fresh reader, no cache
        assert store.compact(table) == 0  # the next compaction only deletes the leftovers
        assert len(parquet_files(store, table)) == 1
        assert store.read(table).equals(expected[table])


def test_compacting_a_compacted_table_with_leftovers_of_two_generations(store: TelemetryStore) -> None:
    """Leftovers of a first compaction stay excluded after a second one replaced the first's output."""
    for index in range(3):
        store.append("reviews", [review(f"p{index}")])
    first_sources = {path.name: path.read_bytes() for path in parquet_files(store, "reviews")}
    store.compact("reviews")
    (first,) = parquet_files(store, "reviews")
    first_bytes = first.read_bytes()
    store.append("reviews", [review("p3")])
    store.compact("reviews")
    for name, data in {**first_sources, first.name: first_bytes}.items():
        (store.root / "reviews" / name).write_bytes(data)  # neither generation's deletes happened
    assert sorted(store.read("reviews")["item_id"]) == ["p0", "p1", "p2", "p3"]


def test_counter_tables_sum_their_increments_per_key_before_and_after_compaction(store: TelemetryStore) -> None:
    early, late = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)
    store.append(
        "node_stats", [{"scope": "s", "node_id": "root", "hits": 1, "accepts": 1, "exits": 0, "last_used_at": late}]
    )
    store.append(
        "node_stats", [{"scope": "s", "node_id": "root", "hits": 1, "accepts": 0, "exits": 1, "last_used_at": early}]
    )
    store.append("node_stats", [{"scope": "other", "node_id": "root", "hits": 1, "accepts": 0, "exits": 0}])
    expected = [
        {"scope": "s", "node_id": "root", "hits": 2, "accepts": 1, "exits": 1, "last_used_at": late},
        {"scope": "other", "node_id": "root", "hits": 1, "accepts": 0, "exits": 0, "last_used_at": None},
    ]
    assert store.read("node_stats").to_dicts() == expected
    store.compact("node_stats")
    store.append("node_stats", [{"scope": "s", "node_id": "root", "hits": 3, "accepts": 3, "exits": 0}])
    expected[0] |= {"hits": 5, "accepts": 4}
    assert store.read("node_stats").to_dicts() == expected


def test_a_compaction_that_raced_a_slow_append_still_lets_the_later_write_win(store: TelemetryStore) -> None:
    """A slow writer takes its stamp, a compaction then merges files on both sides of it, and only then the slow
    file lands: its name sorts before the compacted file, its row is a later write than the merged one of its
    key. Readers must not go by names alone."""
    store.append("store_meta", [{"key": "k", "value": "old"}])
    store.append("store_meta", [{"key": "other", "value": "x"}])
    stamps = sorted(int(path.name.split("-")[0]) for path in parquet_files(store, "store_meta"))
    slow = (stamps[0] + stamps[1]) // 2  # stamped between the two writes, written after the compaction below
    assert stamps[0] < slow < stamps[1]
    assert store.compact("store_meta") == 2
    frame = pl.DataFrame({"key": ["k"], "value": ["new"], "_seq": [slow]})
    frame.write_parquet(store.root / "store_meta" / f"{slow:020d}-1-slow.parquet")
    (compacted,) = [path for path in parquet_files(store, "store_meta") if path.name.endswith(".compacted.parquet")]
    assert parquet_files(store, "store_meta")[0].name.endswith("-slow.parquet") and compacted.name > f"{slow:020d}"

    in_write_order = [("k", "new"), ("other", "x")]  # the slow row's stamp comes before the other key's
    assert store.read("store_meta").rows() == in_write_order
    assert store.scan("store_meta").collect().rows() == in_write_order
    assert store.compact("store_meta") == 2
    assert store.read("store_meta").rows() == in_write_order


_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 9)), min_size=1)),
        st.tuples(st.just("count"), st.lists(st.sampled_from("xyz"), min_size=1, max_size=3)),
        st.tuples(st.just("compact"), st.just([])),
    ),
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(operations=_OPERATIONS)
def test_reads_match_a_model_of_last_writes_through_any_appends_and_compactions(
    operations: list[tuple[str, list[Any]]],
) -> None:
    """Keyed rows: the last write per key, in the order of those writes; counters: the sum per key, in order of
    first write; a log: every row. Whatever mix of appends and compactions came before, and both ways of reading."""
    keyed: dict[str, str] = {}
    counted: dict[str, int] = {}
    logged: list[str] = []
    with tempfile.TemporaryDirectory() as root:
        store = TelemetryStore(root)
        for operation, items in operations:
            if operation == "put":
                store.append("store_meta", [{"key": key, "value": str(value)} for key, value in items])
                for key, value in items:  # within one append the last row per key wins, in its position
                    keyed.pop(key, None)
                    keyed[key] = str(value)
                logged += [key for key, _ in items]
                store.append("reviews", [review(key) for key, _ in items])
            elif operation == "count":
                rows = [{"scope": "s", "node_id": node, "hits": 1, "accepts": 0, "exits": 0} for node in items]
                store.append("node_stats", rows)
                for node in items:
                    counted[node] = counted.get(node, 0) + 1
            else:
                for table in ("store_meta", "reviews", "node_stats"):
                    store.compact(table)
            last_rows = [(key, keyed[key]) for key in keyed]
            for read in (store.read, lambda table: store.scan(table).collect()):
                assert read("store_meta").rows() == last_rows
                assert read("reviews")["item_id"].to_list() == logged
                assert read("node_stats").select("node_id", "hits").rows() == list(counted.items())
            chosen = [*sorted(keyed)[::2], "never written"]  # read with each file filtered as it is read
            only = store.scan("store_meta", only={"key": chosen}).collect().rows()
            assert only == [(key, value) for key, value in last_rows if key in chosen]


def test_a_scan_for_some_keys_reads_the_rows_a_filter_after_the_scan_keeps_and_takes_key_columns_only(
    store: TelemetryStore,
) -> None:
    store.record_trace(make_trace(trace_id="t1", output="first"))
    store.record_trace(make_trace(trace_id="t2"))
    store.compact("traces")
    store.record_trace(make_trace(trace_id="t1", output="second"))  # supersedes t1 of the compacted file
    store.record_trace(make_trace(trace_id="t3"))
    wanted = ["t1", "t3", "t9"]
    only = store.scan("traces", only={"trace_id": wanted}).collect()
    assert only.equals(store.scan("traces").filter(pl.col("trace_id").is_in(wanted)).collect())
    assert only.select("trace_id", "output").rows() == [("t1", "second"), ("t3", make_trace().output)]
    with pytest.raises(TelemetryError, match=r"only= takes its key columns \('trace_id',\), not \['task'\]"):
        store.scan("traces", only={"task": ["support"]})


def test_a_scan_whose_files_a_compaction_deleted_before_the_collect_is_scanned_again(tmp_path: Path) -> None:
    """The soak's finding: a scan planned, a compaction deleting its files, then the collect raises
    ``FileNotFoundError``; ``rescanning`` runs the read again over the compacted file, and every row is there."""
    store = TelemetryStore(tmp_path)
    for index in range(5):
        store.record_trace(make_trace(f"t{index}"))
    attempts: list[int] = []

    def read() -> pl.DataFrame:
        frame = store.scan("traces").select("trace_id")
        if not attempts:
            assert store.compact("traces") >= 2  # the files this scan planned over are gone
        attempts.append(1)
        return frame.collect()

    with pytest.raises(FileNotFoundError):  # without it, the read fails as the soak's batches did
        read()
    store.record_trace(make_trace("t5"))  # two files again: a compacted one and a new one
    attempts.clear()
    rows = store.rescanning(read)
    assert len(attempts) == 2
    assert sorted(rows["trace_id"].to_list()) == [f"t{index}" for index in range(6)]


def test_a_long_lived_store_forgets_the_files_a_compaction_deleted(tmp_path: Path) -> None:
    """What a store object knows per file (footers checked, compacted files' metadata) is per file it saw: a
    long-lived writer whose files are compacted away must not keep an entry for each (a soak process sees ~9,000
    files over 50,000 requests). After 60 traces written one by one and compacted every fifth, with a
    scan and a read between, it remembers no more files than the folder holds, and every row reads back."""
    store, compactor = TelemetryStore(tmp_path), TelemetryStore(tmp_path)
    for index in range(60):
        store.record_trace(make_trace(f"t{index}"))
        assert store.scan("traces").select("trace_id").collect().height == index + 1
        if index % 5 == 4:
            assert compactor.compact("traces") >= 2
            assert store.read("traces").height == index + 1
    present = {str(path) for path in parquet_files(store, "traces")}
    remembered = {key for key in [*store._checks.sound, *store._compacted] if "/traces/" in key}
    assert remembered <= present, sorted(remembered - present)[:3]
    assert sorted(store.read("traces")["trace_id"].to_list()) == sorted(f"t{index}" for index in range(60))


def test_a_store_that_only_writes_a_table_forgets_the_files_a_compaction_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch process writes ``calls`` on every group commit and never reads it: what it knows of the files it
    wrote is forgotten once they are compacted away, every so many writes (20 here), without a read."""
    from gil_core.telemetry import store as store_module

    every = 20
    monkeypatch.setattr(store_module, "_WRITES_BEFORE_FORGETTING", every)
    store, compactor = TelemetryStore(tmp_path), TelemetryStore(tmp_path)
    for index in range(6 * every):
        store.record_calls([make_call(f"c{index}", f"t{index}")])
        if index % 10 == 9:
            compactor.compact("calls")
    remembered = {key for key in store._checks.sound if "/calls/" in key}
    present = {str(path) for path in parquet_files(store, "calls")}
    assert len(remembered - present) < every  # only those gone since its last listing
    assert compactor.read("calls").height == 6 * every


def test_stats_read_while_another_process_compacts_the_tables_never_fail(tmp_path: Path) -> None:
    """``gil stats`` (and the stats artifact after each batch) beside a compactor: a scan whose files the
    compaction deletes before the collect is read again (``rescanning``), so the figures always come back whole."""
    store = TelemetryStore(tmp_path)
    with compacting(tmp_path, "traces") as merged:
        for index in range(150):
            store.record_trace(make_trace(f"t{index}"))
            assert store.stats("support", window=10).requests == index + 1
    assert sum(merged) > 0  # compactions really ran alongside
