"""``python -m llama_cpp.server`` with llama.cpp's ``timings`` added to each chat completion reply.

llama-cpp-python's server answers in the OpenAI format but, unlike llama.cpp's own server, sends no
``timings``, and the energy fit needs the milliseconds spent on the prompt and on the predicted tokens. This
launcher takes exactly the arguments of ``python -m llama_cpp.server``. It reads llama.cpp's performance
counters around each ``create_chat_completion`` and writes them into the JSON reply as llama.cpp's server
does (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``), plus the prompt tokens served from
the reused prefix as ``usage.prompt_tokens_details.cached_tokens``. Per-request access log lines are off.

Run only as a subprocess (``LocalLLMServer`` does); llama_cpp is imported when it runs, so importing this
module needs none of the optional packages.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any

__all__ = ["OWNER_ENV", "TimingsMiddleware", "add_timings", "main"]

_CHAT_PATH = "/v1/chat/completions"
OWNER_ENV = "GIL_LLAMA_OWNER_PID"
"""The process id of the process that owns this server (unset for a shared server): the server stops when that
process is gone, however it ended (a SIGKILL runs no cleanup), instead of holding its memory and port forever."""
_OWNER_POLL_SECONDS = 1.0
_STOP_GRACE_SECONDS = 5.0

# The middleware puts a fresh dict here for each chat request; the wrapped completion (run in a worker
# thread, which inherits a copy of this context) fills that same dict with the counters.
_COUNTERS: ContextVar[dict[str, float] | None] = ContextVar("gil_llama_counters", default=None)

Scope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def add_timings(reply: dict[str, Any], counters: dict[str, float]) -> dict[str, Any]:
    """``reply`` with llama.cpp's ``timings`` and the prompt tokens it did not have to evaluate."""
    prompt_n = int(counters["prompt_n"])
    predicted_n = int(counters["predicted_n"])
    timings = {
        "prompt_n": prompt_n,
        "prompt_ms": counters["prompt_ms"],
        "predicted_n": predicted_n,
        "predicted_ms": counters["predicted_ms"],
    }
    reply = {**reply, "timings": timings}
    usage = reply.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        details = usage.get("prompt_tokens_details")
        details = dict(details) if isinstance(details, dict) else {}
        details.setdefault("cached_tokens", max(usage["prompt_tokens"] - prompt_n, 0))
        reply["usage"] = {**usage, "prompt_tokens_details": details}
    return reply


class TimingsMiddleware:
    """ASGI middleware: buffers JSON replies to chat completions and adds the counters of their call.

    Streamed replies (server-sent events) pass through untouched.
    """

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") != _CHAT_PATH:
            await self._app(scope, receive, send)
            return
        counters: dict[str, float] = {}
        token = _COUNTERS.set(counters)
        start: ASGIMessage | None = None
        chunks: list[bytes] = []

        async def rewrite(message: ASGIMessage) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if _is_json(message):
                    start = message
                    return
            elif message["type"] == "http.response.body" and start is not None:
                chunks.append(bytes(message.get("body", b"")))
                if message.get("more_body", False):
                    return
                body = _rewritten(b"".join(chunks), counters)
                headers = [(key, value) for key, value in start["headers"] if key.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode("ascii")))
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        try:
            await self._app(scope, receive, rewrite)
        finally:
            _COUNTERS.reset(token)


def _is_json(start: ASGIMessage) -> bool:
    for key, value in start.get("headers", ()):
        if key.lower() == b"content-type":
            return bytes(value).startswith(b"application/json")
    return False


def _rewritten(body: bytes, counters: dict[str, float]) -> bytes:
    """The reply with timings when it is a completion and the counters were read; otherwise as it came."""
    if not counters:
        return body
    try:
        reply = json.loads(body)
    except ValueError:
        return body
    if not isinstance(reply, dict) or "choices" not in reply:
        return body
    return json.dumps(add_timings(reply, counters), ensure_ascii=False).encode("utf-8")


def _count_performance(method: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Llama.create_chat_completion``: reset llama.cpp's counters before, read them after."""
    llama_cpp: Any = importlib.import_module("llama_cpp")

    @functools.wraps(method)
    def create_chat_completion(self: Any, *args: Any, **kwargs: Any) -> Any:
        counters = _COUNTERS.get()
        llama_cpp.llama_perf_context_reset(self.ctx)
        result = method(self, *args, **kwargs)
        if counters is not None:
            data = llama_cpp.llama_perf_context(self.ctx)
            counters.update(
                prompt_n=data.n_p_eval,
                prompt_ms=data.t_p_eval_ms,
                predicted_n=data.n_eval,
                predicted_ms=data.t_eval_ms,
            )
        return result

    return create_chat_completion


def watch_owner(owner: int, *, poll_seconds: float = _OWNER_POLL_SECONDS) -> threading.Thread:
    """A daemon thread that stops this process once ``owner`` is no longer its parent (the owner ended and the
    process was reparented): SIGTERM first, so the server shuts down as it does when stopped; if it is still
    running a few seconds later, exit at once."""

    def watch() -> None:
        while os.getppid() == owner:
            time.sleep(poll_seconds)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_STOP_GRACE_SECONDS)
        os._exit(0)

    thread = threading.Thread(target=watch, name="gil-owner-watch", daemon=True)
    thread.start()
    return thread


def main() -> None:
    """Run llama-cpp-python's server (its own command line) with timings in chat completion replies."""
    owner = os.environ.get(OWNER_ENV)
    if owner:
        watch_owner(int(owner))
    # Typed as Any: rebinding attributes of the server's modules is what this function is for.
    llama: Any = importlib.import_module("llama_cpp").Llama
    server_main: Any = importlib.import_module("llama_cpp.server.__main__")
    llama.create_chat_completion = _count_performance(llama.create_chat_completion)
    create_app = server_main.create_app

    def create_timed_app(*args: Any, **kwargs: Any) -> TimingsMiddleware:
        return TimingsMiddleware(create_app(*args, **kwargs))

    # The server's main() builds its app through this module-level name; replacing it keeps its whole
    # command line (and its settings validation) as it is.
    server_main.create_app = create_timed_app
    # A line per request would grow a long-lived server's log without bound and bury its errors.
    server_main.uvicorn.run = functools.partial(server_main.uvicorn.run, access_log=False)
    server_main.main()


if __name__ == "__main__":
    main()
