"""Task files name where the store and memory live: a folder relative to the file, or an ``s3://bucket/prefix``
URI kept whole from the file (or an override) to the runtime; a location that cannot be one is an error naming
the file, the line and the key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gil_core.runtime import open_runtime
from gil_core.taskfile import TaskFileError, load_task_file, with_overrides
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.resolver._support import Script, SupportModel
from tests.telemetry._s3 import ACCESS_KEY_ID, SECRET_ACCESS_KEY, assert_no_key, environment_for, new_bucket, serve_s3

UNUSED = "http://127.0.0.1:9/v1"


def key_line(task: Path, key: str) -> int:
    lines = task.read_text(encoding="utf-8").splitlines()
    return next(number for number, text in enumerate(lines, start=1) if text.startswith(f"{key}:"))


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("s3://bucket/gil/store", "s3://bucket/gil/store"),
        ("s3://bucket/gil/store/", "s3://bucket/gil/store"),
        ("S3://bucket//gil/store", "s3://bucket/gil/store"),
        ("s3://bucket", "s3://bucket"),
    ],
)
def test_an_s3_store_and_memory_stay_uris(written: str, expected: str, tmp_path: Path) -> None:
    loaded = load_task_file(write_task_file(tmp_path, UNUSED, store=written, memory=written.replace("store", "mem")))
    assert loaded.store == expected and isinstance(loaded.store, str)
    assert loaded.memory == expected.replace("store", "mem")


def test_local_folders_are_relative_to_the_task_file_wherever_the_process_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tasks").mkdir()
    monkeypatch.chdir(tmp_path)
    task = write_task_file(tmp_path / "tasks", UNUSED, store="state/store", memory=str(tmp_path / "abs" / "memory"))
    loaded = load_task_file(Path("tasks") / task.name)
    assert loaded.store == Path("tasks") / "state" / "store"
    assert loaded.memory == tmp_path / "abs" / "memory"
    defaults = write_task_file(tmp_path, UNUSED)
    text = "".join(
        line for line in defaults.read_text().splitlines(keepends=True) if not line.startswith(("store", "memory"))
    )
    defaults.write_text(text)
    assert load_task_file(defaults).store == tmp_path / ".gil" / "store"


def test_overrides_replace_the_files_locations_and_keep_uris(tmp_path: Path) -> None:
    task = write_task_file(tmp_path, UNUSED)
    loaded = load_task_file(task, store="s3://bucket/over/store", memory="elsewhere/memory")
    assert (loaded.store, loaded.memory) == ("s3://bucket/over/store", tmp_path / "elsewhere" / "memory")
    changed = with_overrides(loaded, store="s3://other/x/", memory=Path("m"))
    assert (changed.store, changed.memory) == ("s3://other/x", Path("m"))  # as a command line means it


BAD_LOCATIONS = {
    "no bucket": ("s3://", "names a bucket"),
    "no bucket, a prefix": ("s3:///store", "names a bucket"),
    "another scheme": ("gs://bucket/store", "gs:// is not supported"),
    "one slash": ("s3:/bucket/store", "s3://"),
    "a query": ("s3://bucket/store?versionId=1", "without a ?query"),
    "keys in the uri": (f"s3://{ACCESS_KEY_ID}:{SECRET_ACCESS_KEY}@bucket/store", "may not carry credentials"),
}


@pytest.mark.parametrize("name", list(BAD_LOCATIONS))
@pytest.mark.parametrize("key", ["store", "memory"])
def test_a_location_that_cannot_be_one_names_file_line_and_key(name: str, key: str, tmp_path: Path) -> None:
    written, words = BAD_LOCATIONS[name]
    task = write_task_file(tmp_path, UNUSED, **{key: written})
    with pytest.raises(TaskFileError) as raised:
        load_task_file(task)
    message = str(raised.value)
    assert message.startswith(f"{task}:{key_line(task, key)}: {key}: ") and words in message
    assert_no_key(message)


def test_a_bad_override_names_the_file_and_key_but_no_line_of_it(tmp_path: Path) -> None:
    task = write_task_file(tmp_path, UNUSED)
    with pytest.raises(TaskFileError, match=rf"^{task}: store: gs:// is not supported"):
        load_task_file(task, store="gs://bucket/store")
    with pytest.raises(TaskFileError, match=rf"^{task}: memory: .*names a bucket"):
        with_overrides(load_task_file(task), memory="s3://")


s3_endpoint = pytest.fixture(scope="module")(serve_s3)


@pytest.fixture
def s3_environment(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in environment_for(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    yield new_bucket(s3_endpoint)


@pytest.mark.s3
async def test_a_task_file_on_s3_opens_its_runtime_there_with_the_environments_settings(
    s3_environment: str, tmp_path: Path
) -> None:
    bucket = s3_environment
    store, memory = f"s3://{bucket}/gil/store", f"s3://{bucket}/gil/memory"
    text = "where is my refund"
    with ScriptedOpenAIServer(responder=SupportModel({text: Script(route=["billing", "refund status"])})) as server:
        loaded = load_task_file(write_task_file(tmp_path, server.base_url, store=store, memory=memory))
        async with open_runtime(loaded) as runtime:
            assert runtime.store.location == store
            trace = await runtime.resolver.resolve(loaded.task, text)
            await runtime.resolver.feedback(loaded.task, trace.trace_id, correct=True)
        async with open_runtime(loaded) as runtime:
            again = await runtime.resolver.resolve(loaded.task, text)
    assert again.mode == "memory" and again.output == trace.output
    assert TelemetryStore(store).read("traces")["trace_id"].to_list() == [trace.trace_id, again.trace_id]
    assert not (tmp_path / "s3:").exists() and not any(tmp_path.glob("**/gil/store"))


def test_every_task_file_key_is_described_and_checked() -> None:
    from gil_core.taskfile import _KEYS, _TaskFileKeys

    assert set(_TaskFileKeys.model_fields) == set(_KEYS)


def test_a_nested_key_of_the_wrong_type_names_the_line_of_its_section_and_its_path(tmp_path: Path) -> None:
    task = write_task_file(tmp_path, UNUSED, learned_reflex={"precision": 0.9, "memory_cut": 1})
    line = key_line(task, "learned_reflex")
    with pytest.raises(TaskFileError) as raised:
        load_task_file(task)
    assert str(raised.value) == f"{task}:{line}: learned_reflex: learned_reflex.memory_cut must be true or false, got 1"
    assert (raised.value.line, raised.value.key) == (line, "learned_reflex")


def test_the_learned_guess_is_on_unless_the_task_file_turns_it_off(tmp_path: Path) -> None:
    for name in ("on", "off", "bad"):
        (tmp_path / name).mkdir()
    on = load_task_file(write_task_file(tmp_path / "on", UNUSED, learned_reflex={"precision": 0.9}))
    off = load_task_file(write_task_file(tmp_path / "off", UNUSED, learned_reflex={"precision": 0.9, "guess": False}))
    assert on.task.policy.learned is not None and on.task.policy.learned.guess is True
    assert off.task.policy.learned is not None and off.task.policy.learned.guess is False
    with pytest.raises(TaskFileError, match=r"learned_reflex\.guess must be true or false, got 'yes'"):
        load_task_file(write_task_file(tmp_path / "bad", UNUSED, learned_reflex={"precision": 0.9, "guess": "yes"}))


@pytest.mark.parametrize(
    ("changes", "key", "message"),
    [
        ({"order_seed": 7}, "order_seed", "expected seed that shuffles judge candidates per request, got 7"),
        ({"concurrency": 2.5}, "concurrency", "expected model calls in flight during a batch, got 2.5"),
        ({"fallback_scope": "all"}, "fallback_scope", "fallback_scope must be 'path' or 'full', not 'all'"),
        ({"chat_model": {"url": UNUSED, "name": "m", "token": "sk-1"}}, "chat_model", "unknown model key 'token'"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_as_written(
    changes: dict[str, object], key: str, message: str, tmp_path: Path
) -> None:
    """Strict types: YAML's own, never coerced (``7`` is no seed text, ``2.5`` no count)."""
    task = write_task_file(tmp_path, UNUSED, **changes)
    with pytest.raises(TaskFileError) as raised:
        load_task_file(task)
    assert str(raised.value).startswith(f"{task}:{key_line(task, key)}: {key}: {message}"), raised.value
    assert "sk-1" not in str(raised.value)
