"""Where an OpenAI-compatible server is, split from the secrets its URL may carry (``http://user:key@host/v1``,
``?api_key=...``): requests go to the bare URL with the user and password as basic auth and the query as
parameters; messages, logs and traces only ever see the URL with those parts masked."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gil_core._redaction import REDACTED, redact_secrets
from gil_core.errors import ConfigurationError

if TYPE_CHECKING:
    import httpx

__all__ = ["SCHEMES", "Endpoint", "url_problem"]

SCHEMES = ("http", "https")
_SHORTEST_SECRET = 4  # a query value such as "2" or "en" is no secret, and masking it would mangle every message


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a model server's base URL, without repeating it (it may hold a key); None if it can.
    httpx is imported here, not with the module: a task file is checked by commands that never send a request."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"not a URL ({str(exc).split(':')[0]})"
    if parsed.scheme not in SCHEMES:
        return f"a model URL starts with http:// or https://, not {parsed.scheme + ':' if parsed.scheme else 'a path'}"
    if not parsed.host:
        return "a model URL needs a host"
    return None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A base URL taken apart: ``base`` to request, ``shown`` for messages, and the ``secrets`` to redact."""

    base: str
    shown: str
    auth: httpx.BasicAuth | None
    params: tuple[tuple[str, str], ...]
    secrets: tuple[str, ...]

    @classmethod
    def parse(cls, url: str, *, api_key: str | None = None) -> Endpoint:
        """Raises ``ConfigurationError`` (without the URL) for anything but an http(s) URL with a host."""
        problem = url_problem(url)
        if problem is not None:
            raise ConfigurationError(problem)
        import httpx  # see url_problem

        parsed = httpx.URL(url)
        bare = parsed.copy_with(username=None, password=None, query=None, fragment=None)
        base = str(bare).rstrip("/")
        params = tuple(parsed.params.multi_items())
        has_user = bool(parsed.username or parsed.password)
        raw = urlsplit(url)
        raw_values = [pair.partition("=")[2] for pair in raw.query.split("&")]
        candidates = [
            api_key or "",
            parsed.username,
            parsed.password,
            raw.username or "",  # as written, percent-encoded, which is how a library may quote it
            raw.password or "",
            *(value for _, value in params),
            *raw_values,
        ]
        secrets = tuple(dict.fromkeys(value for value in candidates if len(value) >= _SHORTEST_SECRET))
        shown = base
        if has_user:
            shown = shown.replace("://", f"://{REDACTED}@", 1)
        if secrets:
            _HTTPX_LOG_MASK.secrets.update(secrets)
            _mask_httpx_logs()
        auth = httpx.BasicAuth(parsed.username, parsed.password) if has_user else None
        return cls(base, shown, auth, params, secrets)

    def show(self, path: str) -> str:
        """The URL of ``path`` as messages may print it: user, password and query values masked."""
        query = "&".join(f"{name}={REDACTED}" for name, _ in self.params)
        return f"{self.shown}{path}" + (f"?{query}" if query else "")

    def redact(self, text: str) -> str:
        return redact_secrets(text, self.secrets)


class _MaskSecrets(logging.Filter):
    """Masks the query values of model URLs in httpx's own request log (``HTTP Request: POST <url> ...``)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact_secrets(message, self.secrets)
        if masked != message:
            record.msg, record.args = masked, None
        return True


_HTTPX_LOG_MASK = _MaskSecrets()


def _mask_httpx_logs() -> None:
    logger = logging.getLogger("httpx")
    if _HTTPX_LOG_MASK not in logger.filters:
        logger.addFilter(_HTTPX_LOG_MASK)
