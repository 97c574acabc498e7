"""The telemetry store on object storage: an ``s3://bucket/prefix`` root on moto's S3 server (started here, on
loopback) appends, supersedes, reads, computes stats and compacts exactly as a local folder does; compactors
claim a table before touching it; and keys never reach a message, a traceback or a repr."""

from __future__ import annotations

import threading
import traceback
from pathlib import Path

import polars as pl
import pytest

from gil_core.errors import ConfigurationError, TelemetryError
from gil_core.storage import S3Settings, is_object_store, load_s3_settings, location
from gil_core.telemetry import TABLES, TelemetryStore
from gil_core.telemetry.sqlite import export_sqlite, import_sqlite
from tests.telemetry._s3 import (
    ACCESS_KEY_ID,
    AT,
    SECRET_ACCESS_KEY,
    assert_no_key,
    fill,
    keys_checked,
    new_bucket,
    objects,
    s3_settings,
    serve_s3,
    settings_for,
    trace,
)

s3_endpoint = pytest.fixture(scope="module")(serve_s3)
s3 = pytest.fixture(settings_for)


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    return new_bucket(s3_endpoint)


@pytest.mark.s3
def test_appends_supersede_and_read_back_over_s3_as_in_a_local_folder(
    s3: S3Settings, bucket: str, tmp_path: Path
) -> None:
    remote, local = TelemetryStore(f"s3://{bucket}/gil/store", s3=s3), TelemetryStore(tmp_path / "store")
    for store in (remote, local):
        fill(store)
    for table in ("traces", "calls"):
        assert remote.read(table).equals(local.read(table)), table
        assert remote.scan(table).collect().equals(local.read(table)), table
    assert remote.read("traces").select("trace_id", "feedback_verdict").rows() == [
        ("t0", None), ("t2", None), ("t4", None), ("t5", None), ("t1", "correct"), ("t3", "wrong"),
    ]  # fmt: skip
    again = TelemetryStore(f"s3://{bucket}/gil/store/", s3=s3)  # a fresh reader; a trailing slash is the same place
    assert again.read("traces").equals(local.read("traces"))
    assert len([name for name in objects(s3, bucket, "gil/store") if name.startswith("traces/")]) == 8
    assert again.read("reviews").is_empty() and again.read("reviews").columns == local.read("reviews").columns


@pytest.mark.s3
def test_stats_over_s3_equal_stats_over_the_same_rows_in_a_folder(s3: S3Settings, bucket: str, tmp_path: Path) -> None:
    remote, local = TelemetryStore(f"s3://{bucket}/store", s3=s3), TelemetryStore(tmp_path / "store")
    for store in (remote, local):
        fill(store)
    stats = remote.stats("support", 4)
    assert stats == local.stats("support", 4)
    assert stats.requests == 6 and stats.memory_rate == pytest.approx(2 / 6)
    assert [(mode.mode, mode.judged, mode.correct) for mode in stats.modes] == [("fallback", 1, 1), ("memory", 1, 0)]


@pytest.mark.s3
def test_compaction_over_s3_merges_every_table_into_one_object_and_keeps_every_row_once(
    s3: S3Settings, bucket: str
) -> None:
    store = TelemetryStore(f"s3://{bucket}/store", s3=s3)
    fill(store)
    store.append("node_stats", [{"scope": "s", "node_id": "root", "hits": 1, "accepts": 1, "exits": 0}])
    store.append("node_stats", [{"scope": "s", "node_id": "root", "hits": 2, "accepts": 0, "exits": 2}])
    before = {table: store.read(table) for table in TABLES}

    assert [store.compact(table) for table in ("traces", "calls", "node_stats")] == [8, 6, 2]
    assert all(store.compact(table) == 0 for table in TABLES)  # one object each (or none): nothing to merge
    names = objects(s3, bucket, "store")
    assert [name.split("/")[0] for name in names] == ["calls", "node_stats", "traces"]
    assert all(name.endswith(".compacted.parquet") for name in names)  # no claim object left behind
    for table in TABLES:
        assert store.read(table).equals(before[table]), table
        assert TelemetryStore(f"s3://{bucket}/store", s3=s3).read(table).equals(before[table]), table
    assert store.read("node_stats").select("hits", "exits").rows() == [(3, 2)]

    store.record_trace(trace(7))
    assert store.compact("traces") == 2  # the compacted object and the new one
    assert store.read("traces")["trace_id"].to_list()[-1] == "t7"


@pytest.mark.s3
def test_a_compaction_interrupted_before_its_deletes_over_s3_still_reads_each_row_once(
    s3: S3Settings, bucket: str
) -> None:
    """Simulated by putting the sources back after the merged object was written."""
    store = TelemetryStore(f"s3://{bucket}/store", s3=s3)
    fill(store)
    expected = store.read("traces")
    saved = {name: pl.read_parquet(f"s3://{bucket}/store/{name}", storage_options=s3.polars_options())
             for name in objects(s3, bucket, "store") if name.startswith("traces/")}  # fmt: skip
    store.compact("traces")
    for name, frame in saved.items():
        frame.write_parquet(f"s3://{bucket}/store/{name}", storage_options=s3.polars_options())
    assert len([name for name in objects(s3, bucket, "store") if name.startswith("traces/")]) == 9

    assert TelemetryStore(f"s3://{bucket}/store", s3=s3).read("traces").equals(expected)  # no cached metadata
    assert store.compact("traces") == 0  # only deletes the leftovers
    assert [name for name in objects(s3, bucket, "store") if name.startswith("traces/")] == [
        name for name in objects(s3, bucket, "store") if name.endswith(".compacted.parquet")
    ]
    assert store.read("traces").equals(expected)


@pytest.mark.s3
def test_a_compactor_that_finds_another_ones_claim_leaves_the_table_alone(s3: S3Settings, bucket: str) -> None:
    store = TelemetryStore(f"s3://{bucket}/store", s3=s3)
    fill(store)
    claim = f"{bucket}/store/traces/.claim-00000000000000000001-1-other"
    with s3.filesystem(bucket).open_output_stream(claim) as stream:
        stream.write(b"")
    before = objects(s3, bucket, "store")

    assert store.compact("traces") == 0
    assert objects(s3, bucket, "store") == before  # nothing merged, nothing deleted, the other claim kept
    s3.filesystem(bucket).delete_file(claim)
    assert store.compact("traces") == 8


@pytest.mark.s3
def test_two_compactors_that_claim_in_step_do_not_keep_stopping_each_other(s3: S3Settings, bucket: str) -> None:
    """Two maintainers that claim at the same moment each see the other's claim and back off; they try again
    after a random pause, so one of them compacts each round instead of neither, round after round."""
    root = f"s3://{bucket}/store"
    writer = TelemetryStore(root, s3=s3)
    compactors = [TelemetryStore(root, s3=s3) for _ in range(2)]
    in_step = threading.Barrier(2)
    rounds = 5
    merged: list[list[int]] = [[] for _ in range(rounds)]
    failures: list[BaseException] = []

    def compact(store: TelemetryStore, round_: int) -> None:
        try:
            in_step.wait(timeout=60)
            merged[round_].append(store.compact("reviews"))
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    for round_ in range(rounds):
        for index in (2 * round_, 2 * round_ + 1):
            row = {"task": "t", "reviewed_at": AT, "kind": "k", "item_id": f"r{index}", "decision": "d"}
            writer.append("reviews", [row])
        threads = [threading.Thread(target=compact, args=(store, round_)) for store in compactors]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert failures == []
        assert sorted(merged[round_])[0] == 0 and sum(merged[round_]) >= 2, f"round {round_}: {merged[round_]}"
    assert writer.read("reviews")["item_id"].to_list() == [f"r{index}" for index in range(2 * rounds)]
    assert not [name for name in objects(s3, bucket, "store") if ".claim-" in name]  # no claim left behind


@pytest.mark.s3
def test_concurrent_compactors_and_writers_over_s3_lose_and_duplicate_nothing(s3: S3Settings, bucket: str) -> None:
    """Two compactor threads (each its own store, as two processes would be) while a writer appends."""
    root = f"s3://{bucket}/store"
    writer = TelemetryStore(root, s3=s3)
    done = threading.Event()
    merged: list[int] = []
    failures: list[BaseException] = []

    def compact_until_done() -> None:
        compactor = TelemetryStore(root, s3=s3)
        try:
            while not done.is_set():
                merged.append(compactor.compact("reviews"))
                ids = compactor.read("reviews")["item_id"]
                assert ids.n_unique() == len(ids), "a reader saw a row twice"
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=compact_until_done) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for index in range(60):
            row = {"task": "t", "reviewed_at": AT, "kind": "k", "item_id": f"r{index}", "decision": "d"}
            writer.append("reviews", [row])
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=120)
    assert failures == []
    assert sum(merged) > 0  # compactions really ran alongside the writer
    writer.compact("reviews")
    ids = writer.read("reviews")["item_id"].to_list()
    assert ids == [f"r{index}" for index in range(60)]  # every row once, in write order


@pytest.mark.s3
def test_an_export_from_an_s3_store_imports_into_a_folder_with_identical_tables(
    s3: S3Settings, bucket: str, tmp_path: Path
) -> None:
    remote = TelemetryStore(f"s3://{bucket}/store", s3=s3)
    fill(remote)
    report = export_sqlite(remote, tmp_path / "out.sqlite")
    assert report.rows["traces"] == 6
    local = TelemetryStore(tmp_path / "imported")
    import_sqlite(tmp_path / "out.sqlite", local)
    for table in TABLES:
        assert local.read(table).equals(remote.read(table)), table


# -- keys stay secret -------------------------------------------------------------------------------------


@pytest.mark.s3
def test_a_refused_key_is_a_telemetry_error_that_names_the_place_and_never_the_key(
    s3_endpoint: str, bucket: str
) -> None:
    store = TelemetryStore(f"s3://{bucket}/store", s3=s3_settings(s3_endpoint))
    with keys_checked():
        actions = (lambda: store.record_trace(trace(1)), lambda: store.read("traces"), lambda: store.compact("calls"))
        for action in actions:
            with pytest.raises(TelemetryError) as raised:
                action()
            error = raised.value
            assert f"s3://{bucket}/store" in str(error) and "Access Key Id you provided does not exist" in str(error)
            assert error.__cause__ is None and error.__context__ is None  # no library exception rides along
            assert_no_key(str(error), repr(error), "".join(traceback.format_exception(error)))


@pytest.mark.s3
def test_settings_store_and_plans_never_show_a_key(s3: S3Settings, bucket: str) -> None:
    store = TelemetryStore(f"s3://{bucket}/store", s3=s3)
    fill(store)
    assert_no_key(repr(s3), str(s3), repr(store), store.scan("traces").explain(), str(store.scan("traces")))
    assert s3.polars_options()["aws_access_key_id"] == ACCESS_KEY_ID  # they are there, only never shown


def test_redact_removes_configured_keys_and_what_an_aws_error_body_echoes() -> None:
    """AWS's SignatureDoesNotMatch and InvalidAccessKeyId bodies echo the access key id; a signed URL carries it in
    its credential scope; an options dump names the secret."""
    settings = load_s3_settings(access_key_id=ACCESS_KEY_ID, secret_access_key=SECRET_ACCESS_KEY)
    body = (
        "<Error><Code>SignatureDoesNotMatch</Code><AWSAccessKeyId>AKIAOTHERKEY00000000</AWSAccessKeyId>"
        f"<StringToSign>AWS4-HMAC-SHA256 {ACCESS_KEY_ID}</StringToSign></Error> "
        "GET /b/k?X-Amz-Credential=AKIAOTHERKEY00000000/20261130/us-east-1/s3/aws4_request "
        f"{{'aws_secret_access_key': '{SECRET_ACCESS_KEY}', secret_key=anotherSecretValue}}"
    )
    cleaned = settings.redact(body)
    assert_no_key(cleaned)
    assert "AKIAOTHERKEY00000000" not in cleaned and "anotherSecretValue" not in cleaned
    assert "SignatureDoesNotMatch" in cleaned and "/20261130/us-east-1/s3/aws4_request" in cleaned


# -- settings and locations ---------------------------------------------------------------------------------


def test_settings_come_from_gil_s3_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIL_S3_ENDPOINT", "http://127.0.0.1:9000/")
    monkeypatch.setenv("GIL_S3_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("GIL_S3_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    monkeypatch.setenv("GIL_S3_ALLOW_HTTP", "true")
    settings = load_s3_settings()
    assert settings.polars_options() == {
        "aws_access_key_id": ACCESS_KEY_ID,
        "aws_secret_access_key": SECRET_ACCESS_KEY,
        "aws_region": "us-east-1",  # an S3-compatible endpoint without a region gets the usual default
        "aws_endpoint_url": "http://127.0.0.1:9000",
        "aws_allow_http": "true",
    }
    lance = settings.lancedb_options()
    assert (lance["aws_endpoint"], lance["allow_http"], lance["aws_secret_access_key"]) == (
        "http://127.0.0.1:9000", "true", SECRET_ACCESS_KEY,
    )  # fmt: skip
    monkeypatch.setenv("GIL_S3_REGION", "eu-west-3")
    assert load_s3_settings().polars_options()["aws_region"] == "eu-west-3"


def test_plain_http_needs_allow_http_and_bad_settings_never_quote_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="GIL_S3_ALLOW_HTTP"):
        load_s3_settings(endpoint="http://127.0.0.1:9000")
    monkeypatch.setenv("GIL_S3_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    monkeypatch.setenv("GIL_S3_ENDPOINT", "ftp://example")
    with pytest.raises(ConfigurationError, match="GIL_S3_ENDPOINT") as raised:
        TelemetryStore("s3://bucket/store")
    assert_no_key(str(raised.value), "".join(traceback.format_exception(raised.value)))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("s3://bucket/a/b/", "s3://bucket/a/b"),
        ("s3://bucket", "s3://bucket"),
        ("relative/store", Path("relative/store")),
        (Path("/var/store"), Path("/var/store")),
    ],
)
def test_a_location_is_an_s3_uri_string_or_a_local_path(given: str | Path, expected: str | Path) -> None:
    assert location(given) == expected
    assert is_object_store(location(given)) == isinstance(expected, str)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("gs://bucket/store", "gs:// is not supported"),
        ("s3:///store", "names a bucket"),
        (Path("s3://bucket/store"), "pass the URI as a string"),
        (Path("/home/me/tasks") / "s3://bucket/store", "pass the URI as a string"),
        (f"s3://{ACCESS_KEY_ID}:{SECRET_ACCESS_KEY}@bucket/store", "may not carry credentials"),
    ],
)
def test_a_location_that_cannot_be_a_store_is_refused_clearly(given: str | Path, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        TelemetryStore(given)
    assert_no_key(str(raised.value))
