"""A task file wired to a scripted loopback server, for CLI and flow tests."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.resolver._support import ROOT


def write_task_file(directory: Path, base_url: str, **changes: object) -> Path:
    data: dict[str, object] = {
        "task": "support",
        "tree": str(ROOT / "ontologies" / "support.yaml"),
        "language": "en",
        "thresholds": {"per_layer": [0.6], "leaf": 0.7},
        "memory_threshold": 0.95,
        "chat_model": {"url": base_url, "name": "scripted"},
        "embedding_model": "hash",
        "store": str(directory / "store"),
        "memory": str(directory / "memory"),
    }
    data.update(changes)
    path = directory / "task.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
