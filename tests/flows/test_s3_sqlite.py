"""``gil export-sqlite`` and ``gil import-sqlite`` take a store as the task file does, a folder or an ``s3://`` URI
kept whole (moto's S3 server, started here on loopback): a round trip from a store in the bucket to a local SQLite
file and into another prefix keeps every table; a location that cannot be a store is one line naming it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.telemetry import TelemetryStore
from gil_core.telemetry.schemas import GIL_COLUMNS
from gil_core.telemetry.schemas import REFERENCE_TABLES as TABLES
from gil_core.testing import write_compat_fixture
from tests.telemetry._s3 import assert_no_key, bucket_in_environment, objects, s3_settings, serve_s3

pytestmark = pytest.mark.s3

runner = CliRunner()
s3_endpoint = pytest.fixture(scope="module")(serve_s3)
bucket = pytest.fixture(bucket_in_environment)  # the command reaches it with this process's GIL_S3_*


def invoke(*arguments: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(arguments))
    assert_no_key(result.stdout, result.stderr)
    return result.exit_code, result.stdout, result.stderr


def test_an_s3_store_exported_to_sqlite_and_imported_into_another_prefix_keeps_every_table(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    local_store, fixture_db = write_compat_fixture(tmp_path / "compat")  # every table non-empty, awkward values
    source, copy = f"s3://{bucket}/gil/store", f"s3://{bucket}/elsewhere/store/"
    assert invoke("import-sqlite", str(fixture_db), source)[0] == 0

    out = tmp_path / "exported.sqlite"
    code, stdout, stderr = invoke("export-sqlite", source, str(out), "--json")
    assert code == 0 and stderr == "", stderr
    with sqlite3.connect(out) as connection:
        assert connection.execute("select count(*) from traces").fetchone()[0] > 0
    code, stdout, stderr = invoke("import-sqlite", str(out), copy, "--json")
    assert code == 0, stderr
    assert '"store": "s3://' + bucket + '/elsewhere/store"' in stdout  # the URI whole, not folded to s3:/

    settings = s3_settings(s3_endpoint)
    expected = TelemetryStore(local_store)
    for where in (source, copy):
        store = TelemetryStore(where, s3=settings)
        for table in TABLES:  # the reference's layout: Gil's own columns stay behind in the source store
            gil_own = GIL_COLUMNS.get(table, ())
            assert store.read(table).drop(gil_own).equals(expected.read(table).drop(gil_own)), (where, table)
    assert {name.split("/")[0] for name in objects(settings, bucket, "elsewhere/store")} == set(TABLES)
    assert not list(Path.cwd().glob("s3:*")) and not list(tmp_path.glob("s3:*"))


def test_an_empty_prefix_exports_with_a_warning(tmp_path: Path, bucket: str) -> None:
    code, _, stderr = invoke("export-sqlite", f"s3://{bucket}/no/store/here", str(tmp_path / "empty.sqlite"))
    assert code == 0 and f"s3://{bucket}/no/store/here holds no rows" in stderr


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("s3:/bucket/store", "gil {command}: STORE: s3:/bucket/store: looks like an s3:// URI that lost a slash"),
        ("gs://bucket/store", "gil {command}: STORE: gs:// is not supported"),
        ("s3://", "gil {command}: STORE: s3://: an s3:// location names a bucket"),
        ("s3://bucket/store?versionId=1", "without a ?query"),
    ],
)
def test_a_store_argument_that_cannot_be_a_store_is_one_line_naming_it(
    tmp_path: Path, store: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a folded URI would be a folder here
    database = tmp_path / "some.sqlite"
    sqlite3.connect(database).close()
    for command, arguments in (("export-sqlite", (store, "out.sqlite")), ("import-sqlite", (str(database), store))):
        code, _, stderr = invoke(command, *arguments)
        assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
        assert message.format(command=command) in stderr.replace("\n", " ")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["some.sqlite"]  # nothing written anywhere


def test_a_local_store_still_needs_its_folder(tmp_path: Path) -> None:
    code, _, stderr = invoke("export-sqlite", str(tmp_path / "absent"), str(tmp_path / "out.sqlite"))
    assert code == 2 and f"{tmp_path / 'absent'}: no such store directory" in stderr


def test_a_restricted_store_in_a_bucket_is_refused_naming_its_uri(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    where = f"s3://{bucket}/private/store"
    TelemetryStore(where, s3=s3_settings(s3_endpoint)).append("store_meta", [{"key": "restricted", "value": "1"}])
    out = tmp_path / "refused.sqlite"
    code, _, stderr = invoke("export-sqlite", where, str(out))
    assert code == 2 and where in stderr and "restricted" in stderr, stderr
    assert not out.exists()
