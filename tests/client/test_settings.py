"""Process settings (GIL_*) and the client parts they switch on."""

from __future__ import annotations

from pathlib import Path

import pytest

from gil_core.client import (
    CachingChatModel,
    InProcessOperationLog,
    InProcessRequestCache,
    JsonLinesOperationLog,
    TokenBucketLimiter,
)
from gil_core.errors import ConfigurationError
from gil_core.settings import IN_PROCESS_LOG, ClientParts, GilSettings, build_chat_model, load_settings
from gil_core.testing import ScriptedChatModel
from tests.client._support import user


@pytest.fixture(autouse=True)
def _no_suite_wide_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py turns the limiter off for the suite; these tests read the real defaults."""
    monkeypatch.delenv("GIL_REQUESTS_PER_SECOND", raising=False)


def test_the_defaults_turn_on_cache_and_limiter_but_not_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOG_PATH", "CACHE_ENABLED", "CACHE_CAPACITY", "CACHE_TTL_SECONDS", "REQUESTS_PER_SECOND", "BURST"):
        monkeypatch.delenv(f"GIL_{name}", raising=False)
    settings = load_settings()
    assert (settings.log_path, settings.cache_enabled, settings.cache_capacity, settings.cache_ttl_seconds) == (
        "",
        True,
        1_000,
        3_600.0,
    )
    assert (settings.requests_per_second, settings.burst) == (5.0, 10)
    parts = ClientParts.from_settings(settings)
    assert isinstance(parts.cache, InProcessRequestCache) and parts.cache.stats().capacity == 1_000
    assert isinstance(parts.limiter, TokenBucketLimiter) and parts.log is None


def test_the_environment_is_read_when_settings_are_loaded_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIL_CACHE_CAPACITY", "7")
    monkeypatch.setenv("GIL_REQUESTS_PER_SECOND", "0")
    monkeypatch.setenv("GIL_LOG_PATH", IN_PROCESS_LOG)
    settings = load_settings()  # the module was imported before the variables were set
    assert (settings.cache_capacity, settings.requests_per_second) == (7, 0.0)
    parts = ClientParts.from_settings(settings)
    assert parts.limiter is None and isinstance(parts.log, InProcessOperationLog)


@pytest.mark.parametrize(
    "overrides",
    [{"cache_capacity": 0}, {"cache_ttl_seconds": 0}, {"requests_per_second": -1}, {"burst": 0}, {"unknown": 1}],
)
def test_invalid_settings_are_configuration_errors(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        load_settings(**overrides)


def test_a_log_path_writes_under_that_store_root(tmp_path: Path) -> None:
    parts = ClientParts.from_settings(GilSettings(log_path=str(tmp_path)))
    assert isinstance(parts.log, JsonLinesOperationLog) and parts.log.folder == tmp_path / "operation_log"


def test_a_log_path_that_is_a_uri_is_refused_rather_than_folded_into_a_local_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="s3://bucket/ops"):
        ClientParts.from_settings(GilSettings(log_path="s3://bucket/ops"))
    assert not (Path.cwd() / "s3:").exists()


def test_a_users_own_part_replaces_the_built_in_one_only_while_its_setting_is_on() -> None:
    mine_cache, mine_limiter, mine_log = InProcessRequestCache(5), TokenBucketLimiter(1, 1), InProcessOperationLog()
    on = GilSettings(log_path=IN_PROCESS_LOG)
    parts = ClientParts.from_settings(on, cache=mine_cache, limiter=mine_limiter, log=mine_log)
    assert (parts.cache, parts.limiter, parts.log) == (mine_cache, mine_limiter, mine_log)

    off = GilSettings(cache_enabled=False, requests_per_second=0, log_path="")
    parts = ClientParts.from_settings(off, cache=mine_cache, limiter=mine_limiter, log=mine_log)
    assert (parts.cache, parts.limiter, parts.log) == (None, None, None)


async def test_build_chat_model_wraps_the_model_in_the_parts_that_are_on() -> None:
    inner = ScriptedChatModel(name="m")
    inner.enqueue("cached answer")
    parts = ClientParts.from_settings(GilSettings(requests_per_second=0, log_path=IN_PROCESS_LOG))
    model = build_chat_model(inner, parts, provider="local", tenant="acme", schema="v1")
    assert isinstance(model, CachingChatModel)
    await model.complete(user("q"), max_tokens=4)
    await model.complete(user("q"), max_tokens=4)
    assert len(inner.history) == 1
    assert parts.log is not None and len(parts.log.entries()) == 1

    off = GilSettings(cache_enabled=False, requests_per_second=0)
    assert build_chat_model(inner, off, provider="local", tenant="acme", schema="v1") is inner
