"""``ScriptedOpenAIServer``: an OpenAI-compatible HTTP server on loopback answering from a script, so the httpx
adapters are tested over a real socket, failure modes included (scripted failures and a seeded fault mix)."""

from __future__ import annotations

import itertools
import json
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, cast, get_args

from gil_core.llm.ports import Completion
from gil_core.testing._script import (
    FailureKind,
    ScriptedReply,
    _count_words,
    _Failure,
    _Item,
    _RawReply,
    _realize,
    _Script,
)
from gil_core.testing.hash_embedding import HashEmbeddingModel

__all__ = ["ReceivedRequest", "ScriptedOpenAIServer", "StreamedReply"]

_MIX_ONLY = ("reset", "slow")
"""Faults a ``fault_mix`` draws besides every ``FailureKind``: "reset" resets the connection (TCP RST) after the
request was read, without a reply; "slow" sends the healthy reply after ``slow_seconds``."""

_CHAT_PATH = "/v1/chat/completions"
_EMBEDDINGS_PATH = "/v1/embeddings"
_MAX_HANG_SECONDS = 30.0
_HUGE_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """One request ``ScriptedOpenAIServer`` received: path, JSON body, headers with lower-case names, the query
    string, and when it arrived (``time.monotonic()``)."""

    path: str
    body: Mapping[str, Any]
    headers: Mapping[str, str]
    query: str = ""
    received_at: float = 0.0


@dataclass(slots=True)
class StreamedReply:
    """A "drip" or "huge" reply ``ScriptedOpenAIServer`` sent: how many body bytes went out, and whether the
    client hung up before the server was done (it never is, for a drip); ``done`` is set once the server stopped
    sending (it notices a client that hung up at its next write)."""

    kind: str
    bytes_sent: int = 0
    client_hung_up: bool = False
    done: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    payload: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    # A body sent piece by piece after ``payload`` (drip, huge); the pieces are made as they are sent.
    stream: Iterator[bytes] | None = None
    record: StreamedReply | None = None
    length: int | None = None  # the Content-Length announced; None: len(payload), or none at all when streaming


_RESET = _Response(0, b"")  # the sentinel reply: reset the connection


def _json_response(status: int, body: object, headers: Mapping[str, str] | None = None) -> _Response:
    return _Response(status, json.dumps(body, ensure_ascii=False).encode(), headers=headers or {})


def _error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> _Response:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return _json_response(status, {"error": {"message": message, "type": kind, "code": status}}, headers)


def _completion_json(completion: Completion, asked: int, omit_logprobs: bool) -> dict[str, Any]:
    """``completion`` in the OpenAI chat layout, with llama.cpp's ``timings`` when it has them."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": completion.content},
        "finish_reason": completion.finish_reason,
    }
    if asked > 0 and not omit_logprobs:
        alternatives = [{"token": t.token, "logprob": t.logprob} for t in completion.top_logprobs]
        first = [{**alternatives[0], "top_logprobs": alternatives}] if alternatives else []
        choice["logprobs"] = {"content": first}
    usage = completion.usage
    reply: dict[str, Any] = {
        "object": "chat.completion",
        "model": completion.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        },
    }
    if completion.timings is not None:
        reply["timings"] = {
            "prompt_ms": completion.timings.prompt_ms,
            "predicted_ms": completion.timings.predicted_ms,
        }
    return reply


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a hanging handler must never hold up close()

    def __init__(self, owner: ScriptedOpenAIServer, port: int = 0) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {name.lower(): value for name, value in self.headers.items()}
        path, _, query = self.path.partition("?")
        response = cast(_HTTPServer, self.server).owner._answer(path, raw, headers, query)
        if response is _RESET:
            # Linger 0 makes close() send RST instead of FIN: the client's read fails with a reset connection.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if response is None:
            return  # the connection closes without a reply
        try:
            self.send_response(response.status)
            for name, value in {**response.headers, "Content-Type": response.content_type}.items():
                self.send_header(name, value)
            length = response.length if response.length is not None else len(response.payload)
            if response.stream is None or response.length is not None:
                self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.write(response.payload)
            for piece in response.stream or ():
                self.wfile.write(piece)
                self.wfile.flush()
                if response.record is not None:
                    response.record.bytes_sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            if response.record is not None:
                response.record.client_hung_up = True  # the client gave up (its timeout or its cap)
        finally:
            if response.record is not None:
                response.record.done.set()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class ScriptedOpenAIServer(_Script):
    """An OpenAI-compatible HTTP server on 127.0.0.1 (ephemeral port) answering from a script.

    ``POST /v1/chat/completions`` takes the queue (``enqueue``, ``enqueue_failure``, ``enqueue_json``), then
    ``responder(body)``, else answers 500. ``POST /v1/embeddings`` answers with ``HashEmbeddingModel`` vectors
    unless a failure or raw JSON reply is next in the queue. ``requests`` records every request received.
    ``latency_seconds`` delays every reply by a fixed time, as a model server's per-call time; each request
    waits on its own thread, so the server serves any number of calls at once (the client's bound is the limit).
    A queued "refuse" stops listening (connections are refused) until ``resume_listening()``; a "drip" sends one
    byte every ``drip_seconds`` for up to ``hang_seconds``, a "huge" reply ``huge_bytes``; ``streamed`` records
    what each of those sent.

    ``fault_mix`` injects faults at random, as a flaky server or network would: a mapping of fault to the share of
    requests (chat and embeddings) that get it, drawn per request from ``random.Random(fault_seed)``, so one seed
    gives one sequence of draws (which request meets which draw still depends on arrival order). A fault is any
    ``FailureKind``, "reset" (the connection is reset after the request was read: TCP RST, no reply) or "slow"
    (the healthy reply, ``slow_seconds`` late). A queued item is served before any draw; ``faults`` counts what
    the mix injected, by fault.
    """

    def __init__(
        self,
        *,
        responder: Callable[[Mapping[str, Any]], ScriptedReply | Completion | str] | None = None,
        api_key: str | None = None,
        embedding_dimensions: int = 64,
        hang_seconds: float = _MAX_HANG_SECONDS,
        latency_seconds: float = 0.0,
        drip_seconds: float = 2.0,
        huge_bytes: int = 300 * 1024 * 1024,
        fault_mix: Mapping[str, float] | None = None,
        fault_seed: int = 0,
        slow_seconds: float = 1.0,
    ) -> None:
        super().__init__()
        if drip_seconds <= 0 or huge_bytes < 0:
            raise ValueError(f"drip_seconds must be > 0 and huge_bytes >= 0 ({drip_seconds}, {huge_bytes})")
        if not 0.0 <= slow_seconds <= _MAX_HANG_SECONDS:
            raise ValueError(f"slow_seconds must be within 0..{_MAX_HANG_SECONDS:g}, got {slow_seconds}")
        self._fault_mix = _checked_mix(fault_mix or {})
        self._fault_random = random.Random(fault_seed)
        self._slow_seconds = slow_seconds
        self.faults: Counter[str] = Counter()
        if not 0.0 <= latency_seconds <= _MAX_HANG_SECONDS:
            raise ValueError(f"latency_seconds must be within 0..{_MAX_HANG_SECONDS:g}, got {latency_seconds}")
        self._responder = responder
        self._api_key = api_key
        self._embedder = HashEmbeddingModel(embedding_dimensions)
        self._hang_seconds = min(hang_seconds, _MAX_HANG_SECONDS)
        self._latency_seconds = latency_seconds
        self._drip_seconds = drip_seconds
        self._huge_bytes = huge_bytes
        self._closing = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._listening = False
        self._state_lock = threading.Lock()
        self.requests: list[ReceivedRequest] = []
        self.streamed: list[StreamedReply] = []

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        if self._httpd is None:
            raise RuntimeError("ScriptedOpenAIServer is not started: use `with` or call start()")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> Self:
        """Bind an ephemeral loopback port and serve from a background thread."""
        if self._httpd is not None:
            raise RuntimeError("ScriptedOpenAIServer is already started")
        self._serve(_HTTPServer(self))
        return self

    def resume_listening(self) -> None:
        """Listen again on the same port after a "refuse", as a server back from a restart would."""
        with self._state_lock:
            if self._httpd is None or self._listening or self._closing.is_set():
                return
            port = self._httpd.server_address[1]
        self._serve(_HTTPServer(self, port))

    def _serve(self, httpd: _HTTPServer) -> None:
        self._httpd = httpd
        # A short poll interval keeps shutdown (and "refuse") fast.
        self._thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        with self._state_lock:
            self._listening = True
        self._refuse_if_next()

    def close(self) -> None:
        """Release hanging requests, stop serving and close the socket; safe to call twice."""
        self._closing.set()
        if self._httpd is None:
            return
        self._stop_listening()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def enqueue_json(self, body: Mapping[str, Any] | Sequence[Any] | bytes, *, status: int = 200) -> None:
        """Queue a reply sent verbatim, for shapes the protocol does not promise (bytes are the body itself, as
        JSON or not); either endpoint takes it."""
        self._push(_RawReply(status, body))

    def _push(self, item: _Item) -> None:
        super()._push(item)
        self._refuse_if_next()

    def _refuse_if_next(self) -> None:
        """Stop listening once a queued "refuse" is next, so the following connect is refused."""
        with self._lock:
            head = self._queue[0] if self._queue and self._listening else None
            refuse = isinstance(head, _Failure) and head.kind == "refuse"
            if refuse:
                self._queue.popleft()
        if refuse:
            self._stop_listening()

    def _stop_listening(self) -> None:
        with self._state_lock:
            if not self._listening or self._httpd is None:
                return
            self._listening = False
        self._httpd.shutdown()
        self._httpd.socket.close()

    def _answer(self, path: str, raw: bytes, headers: Mapping[str, str], query: str = "") -> _Response | None:
        """The reply to one request (None: close the connection without one). Runs on a handler thread."""
        received_at = time.monotonic()
        if self._latency_seconds:
            self._closing.wait(self._latency_seconds)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _error_response(400, "request body is not a JSON object")
        with self._lock:
            self.requests.append(ReceivedRequest(path, body, headers, query, received_at))
        if self._api_key is not None and headers.get("authorization") != f"Bearer {self._api_key}":
            return _error_response(401, "invalid api key")
        if path not in (_CHAT_PATH, _EMBEDDINGS_PATH):
            return _error_response(404, f"no route {path}")
        chat = path == _CHAT_PATH
        item = self._take(lambda head: chat or isinstance(head, _Failure | _RawReply))
        self._refuse_if_next()
        if item is None and (drawn := self._draw_fault()) is not None:
            if drawn == "reset":
                return _RESET
            if drawn == "slow":
                self._closing.wait(self._slow_seconds)
            else:
                return self._fail(_Failure(cast(FailureKind, drawn)))
        if isinstance(item, _Failure):
            return self._fail(item)
        if isinstance(item, _RawReply):
            if isinstance(item.body, bytes):
                return _Response(item.status, item.body)
            return _json_response(item.status, item.body)
        if not chat:
            return self._embeddings(body)
        return self._chat(body, item)

    def _draw_fault(self) -> str | None:
        """The fault ``fault_mix`` gives this request, if any (one draw per request, under the lock)."""
        if not self._fault_mix:
            return None
        with self._lock:
            draw = self._fault_random.random()
            for fault, share in self._fault_mix.items():
                if draw < share:
                    self.faults[fault] += 1
                    return fault
                draw -= share
        return None

    def _fail(self, failure: _Failure) -> _Response | None:
        if failure.kind == "hang":
            self._closing.wait(self._hang_seconds)
            return None
        if failure.kind == "refuse":  # a connect that raced the listener's close
            return None
        if failure.kind == "garbage":
            return _Response(200, b"<html><body>502 Bad Gateway (not JSON)</body></html>", "text/html")
        if failure.kind in ("drip", "huge"):
            record = StreamedReply(failure.kind)
            with self._lock:
                self.streamed.append(record)
            if failure.kind == "drip":  # announces a body it never finishes
                return _Response(200, b"", stream=self._drip(), record=record, length=1 << 20)
            return _Response(200, b"", stream=self._huge(), record=record)
        headers: dict[str, str] = {}
        if failure.kind == "429" and failure.retry_after is not None:
            value = failure.retry_after
            headers["Retry-After"] = value if isinstance(value, str) else f"{value:g}"
        return _error_response(int(failure.kind), f"scripted failure {failure.kind}", headers)

    def _drip(self) -> Iterator[bytes]:
        """A JSON reply's first bytes, then white space, one byte every ``drip_seconds``, until ``hang_seconds``
        have passed or the server closes."""
        stop_at = time.monotonic() + self._hang_seconds
        start = b'{"choices": ['
        for index in itertools.count():
            yield start[index : index + 1] or b" "
            if self._closing.wait(self._drip_seconds) or time.monotonic() >= stop_at:
                return

    def _huge(self) -> Iterator[bytes]:
        """A chat reply whose content makes the body ``huge_bytes`` long, made as it is sent."""
        head = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "'
        tail = b'"}, "finish_reason": "stop"}]}'
        yield head
        chunk = b"x" * _HUGE_CHUNK
        left = max(0, self._huge_bytes - len(head) - len(tail))
        while left > 0 and not self._closing.is_set():
            yield chunk[:left]
            left -= min(left, _HUGE_CHUNK)
        yield tail

    def _chat(self, body: Mapping[str, Any], item: _Item | None) -> _Response:
        if item is None and self._responder is not None:
            try:
                answer = self._responder(body)
            except Exception as exc:  # the test's responder is broken: say so in the reply
                return _error_response(500, f"responder raised {exc!r}")
            item = ScriptedReply(answer) if isinstance(answer, str) else answer
        if not isinstance(item, Completion | ScriptedReply):
            return _error_response(500, "ScriptedOpenAIServer: nothing queued and no responder")
        messages = body.get("messages")
        prompt = [m["content"] for m in messages or () if isinstance(m, dict) and isinstance(m.get("content"), str)]
        asked = int(body.get("top_logprobs") or 0) if body.get("logprobs") else 0
        model = body.get("model") if isinstance(body.get("model"), str) else "scripted-model"
        completion = _realize(item, prompt, asked, str(model))
        omit = isinstance(item, ScriptedReply) and item.omit_logprobs
        return _json_response(200, _completion_json(completion, asked, omit))

    def _embeddings(self, body: Mapping[str, Any]) -> _Response:
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            return _error_response(400, "input must be a string or a list of strings")
        data = [
            {"object": "embedding", "index": index, "embedding": list(self._embedder.embed_text(text))}
            for index, text in enumerate(texts)
        ]
        tokens = _count_words(texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        model = body.get("model", self._embedder.name)
        return _json_response(200, {"object": "list", "data": data, "model": model, "usage": usage})


def _checked_mix(mix: Mapping[str, float]) -> dict[str, float]:
    """``mix`` checked: known faults, shares in [0, 1] adding up to at most 1."""
    known = (*get_args(FailureKind), *_MIX_ONLY)
    unknown = sorted(set(mix) - set(known))
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown} in fault_mix; known: {', '.join(known)}")
    if any(not 0.0 <= share <= 1.0 for share in mix.values()) or sum(mix.values()) > 1.0 + 1e-9:
        raise ValueError(f"fault_mix shares must be within 0..1 and add up to at most 1, got {dict(mix)}")
    return dict(mix)
