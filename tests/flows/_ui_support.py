"""Helpers for the `gil ui` / `gil serve` tests: processes started as the user starts them, polling instead of
sleeping, the listening sockets of a process tree, and headless Chromium (Debian's `chromium`), one-shot or driven
by Playwright."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
from matplotlib import image

T = TypeVar("T")
CHROMIUM = "/usr/bin/chromium"
# Every host name but 127.0.0.1 resolves to nothing, so a page cannot reach beyond loopback.
LOOPBACK_ONLY = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
# What every headless Chromium here runs with: no GPU, no QUIC, no first-run, update or sync traffic, loopback only.
QUIET_FLAGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    LOOPBACK_ONLY,
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def gil_command(*arguments: str) -> list[str]:
    """The installed `gil` script beside this interpreter (as a user runs it), else the module."""
    script = Path(sys.executable).with_name("gil")
    return [str(script), *arguments] if script.is_file() else [sys.executable, "-m", "flows.cli", *arguments]


def log_tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def running(command: list[str], log: Path, env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A background process with its output in ``log``; stopped with SIGTERM (SIGKILL after 30 s) on exit."""
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        try:
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)


def wait_for(
    check: Callable[[], T | None], what: str, timeout: float, process: subprocess.Popen[bytes], log: Path
) -> T:
    """Poll ``check`` until it returns a value; fail early, with the process log, if the process died."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise AssertionError(f"{what}: process exited with {process.returncode}\n{log_tail(log)}")
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{log_tail(log)}")
        time.sleep(0.5)


def healthy(api_url: str) -> Callable[[], bool | None]:
    def check() -> bool | None:
        try:
            return httpx.get(f"{api_url}/health", timeout=5.0).status_code == 200 or None
        except httpx.HTTPError:
            return None

    return check


def prefect_env(home: Path) -> dict[str, str]:
    """The environment of the subprocesses: a private PREFECT_HOME, analytics off, no inherited API URL."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="1",
        PREFECT_LOGGING_LEVEL="WARNING",
    )
    return env


def _process_tree(pid: int) -> list[int]:
    pids, index = [pid], 0
    while index < len(pids):
        for task in Path(f"/proc/{pids[index]}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                pids += [int(child) for child in task.read_text().split()]
        index += 1
    return pids


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc prints IPv6 as four little-endian 32-bit words.
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by the process or its descendants."""
    inodes: set[str] = set()
    for member in _process_tree(pid):
        for descriptor in Path(f"/proc/{member}/fd").glob("*"):
            with contextlib.suppress(OSError):
                target = os.readlink(descriptor)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.add((_address(address), int(port, 16)))
    return found


def chromium(url: str, screenshot: Path, *, budget_ms: int = 15000) -> str:
    """Load ``url`` in headless Chromium; write its screenshot and return the DOM of that same rendering.

    Every host name but 127.0.0.1 resolves to nothing, so the page cannot reach beyond loopback.
    """
    with tempfile.TemporaryDirectory(prefix="gil-chromium-") as profile:
        command = [
            shutil.which("chromium") or CHROMIUM,
            "--headless",
            "--no-sandbox",
            *QUIET_FLAGS,
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            "--window-size=1400,900",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={screenshot}",
            "--dump-dom",
            url,
        ]
        done = subprocess.run(command, capture_output=True, timeout=180, check=False)
    if done.returncode != 0 or not screenshot.is_file():
        raise AssertionError(f"chromium failed ({done.returncode}) on {url}:\n{done.stderr.decode()[-2000:]}")
    return done.stdout.decode("utf-8", errors="replace")


@contextlib.contextmanager
def driven_chromium(width: int = 1280, height: int = 1600) -> Iterator[Any]:
    """A Playwright page in Debian's headless Chromium (Playwright's own browser is never downloaded: the
    executable is given), loopback only; the browser is closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium") or CHROMIUM,
            headless=True,
            args=QUIET_FLAGS,  # Playwright adds --headless, --no-sandbox and its own profile
        )
        try:
            yield browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
        finally:
            browser.close()


def drawn_share(png: Path) -> float:
    """Share of pixels that differ from the most common colour: near 0 for a blank page."""
    pixels = image.imread(png)[..., :3].reshape(-1, 3)
    colours, counts = np.unique((pixels * 255).round().astype(np.uint8), axis=0, return_counts=True)
    assert len(colours) > 1, f"{png} is one uniform colour"
    return 1.0 - float(counts.max()) / len(pixels)


def keep_screenshot(png: Path) -> None:
    """Check that ``png`` is not blank, and keep a copy in GIL_UI_SCREENSHOTS when it is set (the README's
    screenshots: GIL_UI_SCREENSHOTS=docs)."""
    assert drawn_share(png) > 0.02, f"{png} is nearly blank"
    if target := os.environ.get("GIL_UI_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(target) / png.name)
