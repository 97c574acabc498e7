"""Per-call options for the recorder and the client decorators, carried in a context variable like ``call_scope``.

The ``ChatModel`` port's signature is fixed and ``extra_body`` goes to the server, so what a caller wants from
the cache, the limiter and the log for one call travels beside the call instead::

    with call_options(bypass_cache=True, intent="refund triage"):
        await model.complete(messages, max_tokens=1)

Blocks nest: an inner block changes only the fields it names. Decorators read ``current_call_options()`` when
the call reaches them, so the options hold for every call made inside the block, and only there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gil_core.errors import ConfigurationError

__all__ = ["CallOptions", "Contract", "call_options", "current_call_options"]


class Contract(Protocol):
    """What a stored reply is re-validated with (``gil_core.fallback.contracts.Contract`` satisfies it)."""

    def validate(self, output: str, language: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class CallOptions:
    """What the decorators do with the calls of one block.

    * ``bypass_cache``: no cache read and no cache write.
    * ``attempt``: which attempt of the caller's retry loop this is (1 = first). Only the first attempt reads
      the cache: a retry exists because an earlier answer was not good enough, so serving a stored one would
      defeat it. A retry's good answer is still stored.
    * ``do_not_record``: the call leaves no trace in the operation log, its reply is not stored in the cache, and
      the call recorder keeps only its counts and price (no content, no raw reply, no logprobs).
    * ``contract``: overrides the caching decorator's contract for re-validating stored answers.
    * ``intent``, ``target_type``, ``tags``: written into the operation log entry.
    """

    bypass_cache: bool = False
    attempt: int = 1
    do_not_record: bool = False
    contract: Contract | None = None
    intent: str | None = None
    target_type: str | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.attempt < 1:
            raise ConfigurationError(f"attempt counts from 1, got {self.attempt}")


_OPTIONS: ContextVar[CallOptions] = ContextVar("gil_call_options", default=CallOptions())  # noqa: B039 - frozen


def current_call_options() -> CallOptions:
    """The options of the innermost ``call_options`` block (defaults outside any)."""
    return _OPTIONS.get()


@contextmanager
def call_options(
    *,
    bypass_cache: bool | None = None,
    attempt: int | None = None,
    do_not_record: bool | None = None,
    contract: Contract | None = None,
    intent: str | None = None,
    target_type: str | None = None,
    tags: tuple[str, ...] | None = None,
) -> Iterator[CallOptions]:
    """Calls made inside this block carry these options; fields left None keep the enclosing block's value."""
    given: dict[str, Any] = {
        "bypass_cache": bypass_cache,
        "attempt": attempt,
        "do_not_record": do_not_record,
        "contract": contract,
        "intent": intent,
        "target_type": target_type,
        "tags": tags,
    }
    options = replace(_OPTIONS.get(), **{name: value for name, value in given.items() if value is not None})
    token = _OPTIONS.set(options)
    try:
        yield options
    finally:
        _OPTIONS.reset(token)
