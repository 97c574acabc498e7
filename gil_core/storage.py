"""Where a store lives: a local folder or an object-store prefix (``s3://bucket/prefix``).

``S3Settings`` (environment ``GIL_S3_*``) turns endpoint, keys, region and ``allow_http`` into the storage options
Polars and LanceDB take, and into pyarrow's native S3 filesystem for the few things Polars does not do (listing a
prefix, deleting objects). ``LocalFolder`` and ``ObjectFolder`` are one folder of immutable files each, with the
same small interface (``Folder``; it and the local folder live in ``gil_core._folders``, and are handed on from
here): list, write one file whole, delete, and hold the folder for one maintainer at a time.

Keys never appear in a repr, a log line or an error message: they are ``SecretStr`` values, and every error text
that came back from the object store goes through ``S3Settings.redact`` before it reaches a message (an S3 error
body can echo the access key id).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import polars as pl
from pydantic import SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_random

from gil_core._folders import Claim, Folder, LocalFolder
from gil_core._redaction import REDACTED, redact_secrets
from gil_core.errors import ConfigurationError

if TYPE_CHECKING:
    from pyarrow.fs import S3FileSystem

__all__ = [
    "OBJECT_STORE_SCHEME",
    "Claim",
    "Folder",
    "LocalFolder",
    "ObjectFolder",
    "S3Settings",
    "is_object_store",
    "load_s3_settings",
    "location",
]

OBJECT_STORE_SCHEME = "s3://"
"""The one object-store scheme stores and memory accept."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_REDACTED = REDACTED
_ERROR_HEAD = 300  # characters of a library's error text kept in a message
# What an S3 error body or an options dump can carry besides the configured values themselves.
_KEY_PATTERNS = (
    re.compile(r"(<AWSAccessKeyId>)[^<]*(</AWSAccessKeyId>)"),
    re.compile(r"(Credential=)[^/,\s\"']+()"),
    re.compile(
        r"((?:aws_)?(?:access_key_id|secret_access_key|session_token|access_key|secret_key)[\"']?\s*[:=]\s*[\"']?)"
        r"[^\"',\s})]+()",
        re.IGNORECASE,
    ),
)
_CLAIM_PREFIX = ".claim-"
_CLAIM_TTL_SECONDS = 900.0  # a claim older than this (by the store's clock) belongs to a maintainer that died
_CLAIM_ATTEMPTS = 4  # tries at a claim before a maintainer leaves the folder to the other one
_CLAIM_BACKOFF_SECONDS = 0.2  # the longest random pause between two tries


# -- settings ---------------------------------------------------------------------------------------------


class S3Settings(BaseSettings):
    """How to reach S3 or an S3-compatible server; each field reads ``GIL_S3_<FIELD NAME>``.

    * ``endpoint``: the server's URL for an S3-compatible store (MinIO, moto, …); unset for AWS itself.
    * ``access_key_id``, ``secret_access_key``, ``session_token``: unset ones are left to the libraries' own
      chains (``AWS_*`` variables, profiles, instance roles).
    * ``region``: required by most S3-compatible servers; ``us-east-1`` when an endpoint is set without one.
    * ``allow_http``: permit a plain ``http://`` endpoint (loopback test servers); refused otherwise.
    """

    model_config = SettingsConfigDict(env_prefix="GIL_S3_", frozen=True, extra="forbid")

    endpoint: str | None = None
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    region: str | None = None
    allow_http: bool = False

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_a_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("http", "https"):
            raise ValueError("the endpoint must be an http:// or https:// URL")
        return value.rstrip("/") if value else None

    def _checked(self) -> None:
        if self.endpoint and self.endpoint.startswith("http://") and not self.allow_http:
            raise ConfigurationError(
                f"GIL_S3_ENDPOINT {self.endpoint} is plain http: set GIL_S3_ALLOW_HTTP=true to allow it"
            )

    def _region(self) -> str | None:
        return self.region or ("us-east-1" if self.endpoint else None)

    def _keys(self) -> dict[str, str]:
        keys = {
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "aws_session_token": self.session_token,
        }
        return {name: value.get_secret_value() for name, value in keys.items() if value is not None}

    def polars_options(self) -> dict[str, str]:
        """``storage_options`` for Polars' ``scan_parquet``, ``write_parquet`` and ``read_parquet_metadata``."""
        return self._options(endpoint="aws_endpoint_url", allow_http="aws_allow_http")

    def lancedb_options(self) -> dict[str, str]:
        """``storage_options`` for ``lancedb.connect_async``."""
        return self._options(endpoint="aws_endpoint", allow_http="allow_http")

    def _options(self, *, endpoint: str, allow_http: str) -> dict[str, str]:
        # Polars and LanceDB both hand these to the Rust object_store crate, which spells two keys differently.
        self._checked()
        options = self._keys()
        if region := self._region():
            options["aws_region"] = region
        if self.endpoint:
            options[endpoint] = self.endpoint
        if self.allow_http:
            options[allow_http] = "true"
        return options

    def filesystem(self, bucket: str) -> S3FileSystem:
        """pyarrow's native S3 filesystem for ``bucket``: listing and deleting, which Polars does not offer."""
        from pyarrow import fs

        self._checked()
        keys = self._keys()
        arguments: dict[str, Any] = {
            "access_key": keys.get("aws_access_key_id"),
            "secret_key": keys.get("aws_secret_access_key"),
            "session_token": keys.get("aws_session_token"),
            "region": self._region() or fs.resolve_s3_region(bucket),
        }
        if self.endpoint:
            parts = urlsplit(self.endpoint)
            arguments |= {"endpoint_override": parts.netloc + parts.path, "scheme": parts.scheme}
        return fs.S3FileSystem(**{name: value for name, value in arguments.items() if value is not None})

    def redact(self, text: str) -> str:
        """``text`` with every configured key, every run of 8 or more of a key's characters (a key the library
        already cut short), and anything shaped like an AWS key field, replaced by ***. ``describe`` cuts after."""
        text = redact_secrets(text, self._keys().values())
        for pattern in _KEY_PATTERNS:
            text = pattern.sub(rf"\g<1>{_REDACTED}\g<2>", text)
        return text

    def describe(self, error: BaseException) -> str:
        """A short, redacted account of an object-store failure for a message: the exception's type, the S3
        error code and message when the server sent them, and the start of the library's text."""
        text = self.redact(str(error))
        head = " ".join(text.split("<?xml", 1)[0].split())[:_ERROR_HEAD]
        code, message = (re.search(rf"<{tag}>([^<]*)</{tag}>", text) for tag in ("Code", "Message"))
        server = f"{code.group(1)}: {message.group(1) if message else ''} — " if code else ""
        return f"{type(error).__name__}: {server}{head}"


def load_s3_settings(**overrides: Any) -> S3Settings:
    """The ``GIL_S3_*`` settings from the environment now, ``overrides`` winning; invalid ones raise
    ``ConfigurationError`` (which never quotes a key)."""
    try:
        settings = S3Settings(**overrides)
    except ValidationError as exc:
        fields = ", ".join("GIL_S3_" + str(error["loc"][0]).upper() for error in exc.errors() if error["loc"])
        reasons = "; ".join(str(error["msg"]) for error in exc.errors())
        raise ConfigurationError(f"invalid object-store settings {fields}: {reasons}") from None
    settings._checked()
    return settings


# -- locations --------------------------------------------------------------------------------------------


def is_object_store(where: str | Path) -> bool:
    """Whether ``where`` names an object-store prefix (an ``s3://`` string) rather than a local folder."""
    return isinstance(where, str) and where.startswith(OBJECT_STORE_SCHEME)


def location(where: str | Path) -> str | Path:
    """``where`` as a store location: an ``s3://bucket/prefix`` string (no trailing slash) or a local ``Path``.

    Raises ``ConfigurationError`` for another scheme, an ``s3://`` URI without a bucket, with credentials, a
    query or a fragment in it, and for a ``Path`` built from an ``s3://`` string (pathlib folds ``//`` into ``/``:
    pass the string).
    """
    if isinstance(where, Path):
        if any(part.lower() == "s3:" for part in where.parts):
            raise ConfigurationError(
                f"{where}: looks like an s3:// URI that lost a slash (pathlib.Path folds // into /): "
                "pass the URI as a string, s3://bucket/prefix"
            )
        return where
    found = _SCHEME.match(where)
    if found is None:
        return Path(where)
    if found.group(0).lower() != OBJECT_STORE_SCHEME:
        raise ConfigurationError(
            f"{found.group(1)}:// is not supported: a store or memory is a local folder or s3://bucket/prefix"
        )
    parts = urlsplit(where)
    if "@" in parts.netloc:
        raise ConfigurationError("an s3:// location may not carry credentials; set GIL_S3_* instead")
    if not parts.netloc:
        raise ConfigurationError(f"{where}: an s3:// location names a bucket (s3://bucket/prefix)")
    if "?" in where or "#" in where:
        # urlsplit would cut the prefix there silently: the store would land elsewhere than the URI says
        raise ConfigurationError(f"{where}: an s3:// location is s3://bucket/prefix, without a ?query or #fragment")
    return f"{OBJECT_STORE_SCHEME}{parts.netloc}/{parts.path.strip('/')}".rstrip("/")


class ObjectFolder:
    """A prefix in an S3 bucket, read and written by Polars; listed and cleaned through pyarrow's S3 filesystem.

    A write is one PUT (or one multipart upload) of the whole file under its final name: S3 makes an object
    visible whole or not at all, and acknowledges it only once stored. There is no rename and no lock: a
    maintainer ``claim``s the folder by writing a dot-object and listing the claims (see ``claim``).
    """

    def __init__(self, uri: str, settings: S3Settings, filesystem: Callable[[], S3FileSystem] | None = None) -> None:
        parts = urlsplit(uri)
        self._uri = uri
        self._bucket_path = f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
        self._options = settings.polars_options()
        # Made on first use (never in the constructor): a store is opened cheaply and fails where it is used.
        self._make_filesystem = filesystem or functools.cache(lambda: settings.filesystem(parts.netloc))

    @property
    def where(self) -> str:
        return self._uri

    @property
    def storage_options(self) -> dict[str, str]:
        return self._options

    def source(self, name: str) -> str:
        return f"{self._uri}/{name}"

    def names(self) -> list[str]:
        return sorted(name for name, _ in self._entries() if name.endswith(".parquet") and not name.startswith("."))

    def write_parquet(self, name: str, frame: pl.DataFrame, metadata: dict[str, str] | None = None) -> None:
        frame.write_parquet(self.source(name), metadata=metadata, storage_options=self._options)

    def remove(self, names: Iterable[str]) -> None:
        for name in names:
            try:
                self._make_filesystem().delete_file(f"{self._bucket_path}/{name}")
            except FileNotFoundError:
                continue

    def read_bytes(self, name: str) -> bytes:
        with self._make_filesystem().open_input_stream(f"{self._bucket_path}/{name}") as stream:
            data: bytes = stream.read()
        return data

    def move_into(self, name: str, target: Folder) -> None:
        """A copy on the server, then a delete: the file may be in both folders for a moment, never in neither
        (a copy refused, e.g. to read-only keys, leaves it where it was)."""
        if not isinstance(target, ObjectFolder):
            raise ConfigurationError(f"{self.where}: cannot move {name} into {target.where}, a folder of another kind")
        filesystem = self._make_filesystem()
        filesystem.copy_file(f"{self._bucket_path}/{name}", f"{target._bucket_path}/{name}")
        filesystem.delete_file(f"{self._bucket_path}/{name}")

    def walk(self) -> list[str]:
        from pyarrow import fs

        selector = fs.FileSelector(self._bucket_path, allow_not_found=True, recursive=True)
        start = len(self._bucket_path) + 1
        return sorted(
            info.path[start:]
            for info in self._make_filesystem().get_file_info(selector)
            if info.type == fs.FileType.File and not info.base_name.startswith(".")
        )

    def remove_stale_temporary_files(self) -> None:
        """Nothing to do: a PUT never leaves a partial object (an unfinished multipart upload stays invisible;
        a bucket lifecycle rule aborts those)."""

    @contextmanager
    def claim(self) -> Iterator[Claim]:
        """Write a claim object, then list the claims: held only if ours is the only live one.

        With read-after-write and list consistency (AWS S3, MinIO, moto), of two maintainers that claim at once
        at most one sees only its own claim, so at most one proceeds. Both may back off: each then withdraws its
        claim and tries again after a random pause (``_CLAIM_ATTEMPTS`` tries in all), so two maintainers that run
        in step do not keep stopping each other. A claim older than 15 minutes by the store's clock belongs to a
        maintainer that died: it is deleted and ignored. A holder must finish within that time, which
        ``Claim.fresh()`` checks.
        """
        started = time.monotonic()
        name = ""
        held = False
        try:
            for attempt in Retrying(
                retry=retry_if_result(lambda held: not held),
                wait=wait_random(0.0, _CLAIM_BACKOFF_SECONDS),
                stop=stop_after_attempt(_CLAIM_ATTEMPTS),
                retry_error_callback=lambda _state: False,
            ):
                with attempt:
                    started = time.monotonic()
                    name = self._put_claim()
                    held = self._only_live_claim(name)
                    if not held:
                        self.remove([name])  # withdrawn before the pause, so the other one may proceed meanwhile
                        name = ""
                if attempt.retry_state.outcome and not attempt.retry_state.outcome.failed:
                    attempt.retry_state.set_result(held)
            yield Claim(held=held, expires=started + _CLAIM_TTL_SECONDS / 3)
        finally:
            if name:
                self.remove([name])

    def _put_claim(self) -> str:
        name = f"{_CLAIM_PREFIX}{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(6)}"
        self._put_empty(name)
        return name

    def _only_live_claim(self, name: str) -> bool:
        """Whether ``name`` is the only live claim (stale ones are deleted on the way)."""
        claims = {entry: modified for entry, modified in self._entries() if entry.startswith(_CLAIM_PREFIX)}
        mine = claims.pop(name, None)
        stale = [
            other for other, modified in claims.items() if mine is not None and modified < mine - _CLAIM_TTL_SECONDS
        ]
        self.remove(stale)
        return mine is not None and len(claims) == len(stale)

    def _entries(self) -> list[tuple[str, float]]:
        """(name, last modified in seconds by the store's clock) of each object directly under the prefix."""
        from pyarrow import fs

        selector = fs.FileSelector(self._bucket_path, allow_not_found=True, recursive=False)
        return [
            (info.base_name, info.mtime.timestamp() if info.mtime is not None else 0.0)
            for info in self._make_filesystem().get_file_info(selector)
            if info.type == fs.FileType.File
        ]

    def _put_empty(self, name: str) -> None:
        with self._make_filesystem().open_output_stream(f"{self._bucket_path}/{name}") as stream:
            stream.write(b"")
