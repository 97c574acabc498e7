"""Hostile configuration files: YAML alias bombs (a recursive alias, a billion-laughs expansion), nesting deep
enough to exhaust the stack, a file far past any legitimate size. Each, in a tree file and in a task file, is one
line naming the file and line with exit code 2, no traceback, and costs the ``gil`` process that reads it no more
time or memory than reading a good file does, give or take a second and a few megabytes (measured by the
kernel's accounting of the child process)."""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core._config_yaml import MAX_CONFIG_BYTES
from tests.reliability._support import ROOT, gil_command

pytestmark = pytest.mark.reliability

SUPPORT_TREE = ROOT / "ontologies" / "support.yaml"
CPU_MARGIN_SECONDS = 1.0  # "refused within a second of parsing"
MEMORY_MARGIN_KB = 32 * 1024


def laughs(levels: int, *, width: int = 10) -> str:
    """Tree nodes each holding ``width`` aliases of the one before: ``width ** levels`` leaves once expanded."""
    lines = ["  - &n0 {id: leaf, options: [{id: o, text: lol}]}"]
    for level in range(1, levels + 1):
        aliases = ", ".join([f"*n{level - 1}"] * width)
        lines.append(f"  - &n{level} {{id: n{level}, children: [{aliases}]}}")
    return "id: root\nchildren:\n" + "\n".join(lines) + "\n"


TASK_HEAD = (
    f"task: bombs\ntree: {SUPPORT_TREE}\nthresholds: {{per_layer: [0.6], leaf: 0.7}}\n"
    "chat_model: {url: 'http://127.0.0.1:9/v1', name: m}\nembedding_model: hash\n"
)
TASK_LAUGHS = (
    TASK_HEAD
    + "examples:\n"
    + "".join(
        f"  - &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]\n" if n else "  - &l0 [lol, lol, lol, lol, lol, lol, lol, lol]\n"
        for n in range(9)
    )
)


@dataclass(frozen=True)
class Bomb:
    """A file, the ``gil`` command that reads it, the line the error must name and words it must hold."""

    kind: str  # "tree" (gil lint-tree FILE) or "task" (gil stats -t FILE)
    text: str
    line: int
    says: str
    measured: bool = True  # read by a child process whose time and memory are measured; else in this process


BOMBS = {
    "tree: recursive alias": Bomb(
        "tree", "id: root\nchildren:\n  - &a\n    id: loop\n    children: [*a]\n", 5, "recursive alias"
    ),
    "tree: billion laughs": Bomb("tree", laughs(9), 8, "alias bomb"),
    "tree: nested 5,000 deep": Bomb(
        "tree", "id: root\ndescription: " + "[" * 5000 + "]" * 5000 + "\n", 2, "deeper", measured=False
    ),
    "task: recursive alias": Bomb("task", TASK_HEAD + "examples: &x [a, *x]\n", 6, "recursive alias", measured=False),
    "task: billion laughs": Bomb("task", TASK_LAUGHS, 12, "alias bomb"),
}


@dataclass(frozen=True)
class Run:
    code: int
    stderr: str
    cpu_seconds: float = 0.0
    peak_kb: int = 0


def arguments(kind: str, path: Path) -> list[str]:
    """The ``gil`` command that reads ``path``: ``lint-tree`` for a tree file, ``stats -t`` for a task file."""
    return ["lint-tree", str(path)] if kind == "tree" else ["stats", "-t", str(path)]


def command(kind: str, path: Path) -> list[str]:
    return gil_command(*arguments(kind, path))


def run_measured(commands: dict[str, list[str]], folder: Path) -> dict[str, Run]:
    """Run the commands at once as child processes; each one's exit code, stderr, CPU time and peak RSS, from
    ``wait4`` (so only that child is measured). A child still running after 120 s is killed."""
    children = {}
    for name, argv in commands.items():
        stderr = (folder / f"{len(children)}.stderr").open("w+", encoding="utf-8")
        child = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        children[name] = (child, stderr)
    runs = {}
    for name, (child, stderr) in children.items():
        watchdog = threading.Timer(120.0, child.kill)  # a guard against a bomb that works, not a measure
        watchdog.start()
        _, status, usage = os.wait4(child.pid, 0)
        watchdog.cancel()
        child.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        runs[name] = Run(child.returncode, stderr.read(), usage.ru_utime + usage.ru_stime, usage.ru_maxrss)
        stderr.close()
    return runs


def bomb_file(folder: Path, name: str) -> Path:
    path = folder / f"bomb-{list(BOMBS).index(name)}.yaml"
    path.write_text(BOMBS[name].text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """The measured bombs, and a good file of each kind read by the same command (a good tree by ``gil
    lint-tree``, a good task file over an empty store by ``gil stats``), each by its own ``gil`` process, all at
    once."""
    folder = tmp_path_factory.mktemp("bombs")
    good_task = folder / "good-task.yaml"
    good_task.write_text(TASK_HEAD + f"store: {folder / 'store'}\nexamples: [lol, lol]\n", encoding="utf-8")
    commands = {"good tree": command("tree", SUPPORT_TREE), "good task": command("task", good_task)}
    for name, bomb in BOMBS.items():
        if bomb.measured:
            commands[name] = command(bomb.kind, bomb_file(folder, name))
    return run_measured(commands, folder)


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_yaml_bomb_is_one_line_naming_file_and_line_in_bounded_time_and_memory(
    name: str, measured: dict[str, Run], tmp_path: Path
) -> None:
    bomb = BOMBS[name]
    good = measured[f"good {bomb.kind}"]
    if bomb.measured:
        run = measured[name]
    else:
        path = bomb_file(tmp_path, name)
        result = CliRunner().invoke(
            app, ["lint-tree", str(path)] if bomb.kind == "tree" else ["stats", "-t", str(path)]
        )
        run = Run(result.exit_code, result.stderr)
    assert good.code == 0, good.stderr
    assert run.code == 2, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    line = run.stderr.strip()
    assert line.startswith("error: ") and f"bomb-{list(BOMBS).index(name)}.yaml:{bomb.line}: " in line, line
    assert bomb.says in line, line
    assert run.cpu_seconds <= good.cpu_seconds + CPU_MARGIN_SECONDS, (run.cpu_seconds, good.cpu_seconds)
    assert run.peak_kb <= good.peak_kb + MEMORY_MARGIN_KB, (run.peak_kb, good.peak_kb)


def test_the_billion_laughs_tree_expands_to_a_billion_nodes_by_yaml_s_own_count() -> None:
    """The bomb is real: nine levels of ten aliases stand for 10**9 leaves (counted without expanding)."""
    import yaml

    root = yaml.compose(laughs(9), Loader=yaml.SafeLoader)
    sizes: dict[int, int] = {}

    def leaves(node: yaml.Node) -> int:
        if id(node) not in sizes:
            children = dict((key.value, value) for key, value in node.value).get("children")
            sizes[id(node)] = sum(leaves(child) for child in children.value) if children else 1
        return sizes[id(node)]

    assert leaves(root) >= 10**9


@pytest.mark.parametrize("kind", ["tree", "task"])
def test_a_configuration_file_past_the_size_cap_is_refused_before_it_is_parsed(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as sparse:
        sparse.truncate(MAX_CONFIG_BYTES + 1)
    result = CliRunner().invoke(app, arguments(kind, path))
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {path}: the file is larger than {MAX_CONFIG_BYTES // 2**20} MiB"
