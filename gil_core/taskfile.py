"""Task files: one YAML file names a task, its tree, language, contract, thresholds, models and store.

Every key is documented in the README ("Task file"). Errors name the file, the line and the key.
Paths in a task file are relative to the file itself; ``store`` and ``memory`` may also be ``s3://bucket/prefix``
URIs, kept as strings (a ``Path`` would fold their ``//``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gil_core._config_yaml import BoundedLoader, YAMLLimitError, read_config_text
from gil_core.errors import ConfigurationError, GilError, TreeFileError
from gil_core.fallback import TextContract, TreeAnswerContract
from gil_core.fallback.contracts import Contract
from gil_core.language import ENGLISH, KOREAN, PromptLanguage
from gil_core.llm._endpoint import url_problem
from gil_core.ontology import Tree, load_tree
from gil_core.settings import GilSettings, load_settings
from gil_core.storage import location
from gil_core.tasks import LearnedPolicy, TaskDefinition, TaskPolicy
from gil_core.traverse import Thresholds

__all__ = ["ModelSpec", "TaskFile", "TaskFileError", "load_task_file", "parse_task_file", "store_location"]

LANGUAGES: dict[str, PromptLanguage] = {"en": ENGLISH, "ko": KOREAN}


class TaskFileError(ConfigurationError):
    """A task file is malformed; the message names the file, the line and the key."""

    def __init__(self, message: str, *, path: str, line: int | None = None, key: str | None = None) -> None:
        self.path, self.line, self.key = path, line, key
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {f'{key}: ' if key else ''}{message}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Where a model is: an OpenAI-compatible ``url`` and ``name``, or ``local`` (the embedded default),
    or for embeddings also ``hash`` (a deterministic stand-in, no model) and ``none``."""

    kind: str  # "remote" | "local" | "hash" | "none"
    url: str | None = None
    name: str | None = None
    api_key_env: str | None = None


@dataclass(frozen=True)
class TaskFile:
    """A loaded task file: the task itself plus where it runs. ``store`` and ``memory`` are local folders
    (``Path``) or ``s3://bucket/prefix`` strings (``gil_core.storage.location``)."""

    task: TaskDefinition
    path: Path
    chat_model: ModelSpec
    embedding_model: ModelSpec
    store: str | Path
    memory: str | Path
    concurrency: int = 4
    order_seed: str | None = None
    client: dict[str, Any] = field(default_factory=dict)
    fallback_chat_model: ModelSpec | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_KEYS = {
    "task": "the task name (tenant); required",
    "tree": "path of the tree YAML; required",
    "language": "en | ko",
    "contract": "tree | text | {kind: text, max_length: N}",
    "thresholds": "{per_layer: [..], leaf: x}; required",
    "memory_threshold": "number or null (memory off)",
    "memory_accept": "number: the same as memory_threshold (give one of the two)",
    "memory_verify": "number below memory_accept: hits between the two are verified by a yes/no judgment",
    "verify_confidence": "0..1: the confidence a verification's yes needs (default 0.8)",
    "memory_failure": "miss | error",
    "fallback_scope": "path | full",
    "allow_fallback": "true | false",
    "use_tree": "true | false (false: every request goes straight to full generation)",
    "exploration_rate": "0..1",
    "show_shadows": "true | false",
    "reflex_threshold": "number or null: judge each node by embeddings first, the LLM only below it",
    "memory_guard": "true | false (refuse memory hits that differ in a negation, number or amount)",
    "learned_reflex": "{precision: 0.5..1, min_support, audit_rate, novelty, window, pooling, regularization, "
    "exemplars, memory_cut} or null: judge each node by the classifier learned from confirmed answers first, where "
    "the log lets it serve (memory_cut: true reads memory's cut from the same log)",
    "fallback_max_attempts": "integer ≥ 1",
    "slot_max_attempts": "integer ≥ 1",
    "fallback_max_tokens": "integer ≥ 1 (tokens one generation may produce; default 512)",
    "examples": "list of example answers shown to generation",
    "chat_model": "local | {url, name, api_key_env}",
    "embedding_model": "local | hash | none | {url, name, api_key_env}",
    "store": "telemetry store: a directory or s3://bucket/prefix",
    "memory": "memory (LanceDB): a directory or s3://bucket/prefix",
    "concurrency": "model calls in flight during a batch",
    "order_seed": "seed that shuffles judge candidates per request",
    "do_not_record": "true: requests of this task are never written with their text",
    "client": "{log_path, log_max_entries, cache_enabled, cache_capacity, cache_ttl_seconds, requests_per_second, "
    "burst, limiter_max_wait_seconds}: the request cache, rate limiter and operation log (GIL_* settings win "
    "where this file says nothing)",
    "fallback_chat_model": "{url, name, api_key_env} | local: answers when the chat model is rate-limited or down",
}


def load_task_file(path: str | Path, **overrides: Any) -> TaskFile:
    """Read a task file; ``overrides`` (e.g. from CLI flags) replace keys of the file."""
    path = Path(path)
    try:
        text = read_config_text(path)
    except YAMLLimitError as exc:
        raise TaskFileError(exc.problem, path=str(path)) from None
    except UnicodeDecodeError as exc:
        raise TaskFileError(f"cannot read the task file: not UTF-8 ({exc.reason})", path=str(path)) from None
    except OSError as exc:
        raise TaskFileError(f"cannot read the task file: {exc.strerror or exc}", path=str(path)) from exc
    return parse_task_file(text, path=path, overrides=overrides)


def parse_task_file(text: str, *, path: Path, overrides: dict[str, Any] | None = None) -> TaskFile:
    where = str(path)
    loader = BoundedLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except YAMLLimitError as exc:
        raise TaskFileError(exc.problem, path=where, line=exc.line) from None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else None
        raise TaskFileError(f"YAML syntax error: {exc.problem}", path=where, line=line) from exc
    finally:
        loader.dispose()
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise TaskFileError("a task file is a mapping of keys to values", path=where, line=1)
    lines: dict[str, int] = {}
    for key, _ in node.value:
        if isinstance(key, yaml.ScalarNode):
            if key.value in lines:
                raise TaskFileError(
                    f"the key is given twice (first on line {lines[key.value]})",
                    path=where,
                    line=key.start_mark.line + 1,
                    key=key.value,
                )
            lines[key.value] = key.start_mark.line + 1
    overridden = {key: value for key, value in (overrides or {}).items() if value is not None}
    data.update(overridden)
    for key in overridden:
        lines.pop(key, None)  # an error in an override names no line of the file: the value is not there
    reader = _Reader(where, lines, data, path.parent)
    return reader.task_file(path)


class _Reader:
    def __init__(self, where: str, lines: dict[str, int], data: dict[str, Any], base: Path) -> None:
        self.where, self.lines, self.data, self.base = where, lines, data, base
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            key = unknown[0]
            raise self.fail(key, f"unknown key (known keys: {', '.join(_KEYS)})")

    def fail(self, key: str, message: str) -> TaskFileError:
        return TaskFileError(message, path=self.where, line=self.lines.get(key), key=key)

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, required: bool = False) -> Any:
        if key not in self.data or (self.data[key] is None and not required):
            if required:
                raise self.fail(key, f"required ({_KEYS[key]})")
            return None if default is ... else default
        value = self.data[key]
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            raise self.fail(key, f"expected {_KEYS[key]}, got {value!r}")
        if not isinstance(value, kind):
            raise self.fail(key, f"expected {_KEYS[key]}, got {value!r}")
        return value

    def path(self, key: str, default: str) -> Path:
        value = Path(self.get(key, str, default))
        return value if value.is_absolute() else self.base / value

    def location(self, key: str, default: str) -> str | Path:
        """An ``s3://`` URI as written (normalised), or a folder relative to the task file."""
        value = self.get(key, (str, Path), default)
        return store_location(value, self.base, path=self.where, key=key, line=self.lines.get(key))

    def model(self, key: str, default: str) -> ModelSpec:
        value = self.data.get(key, default)
        if isinstance(value, str) and value in ("local", "hash", "none"):
            if key in ("chat_model", "fallback_chat_model") and value != "local":
                raise self.fail(key, f"expected {_KEYS[key]}, got {value!r}")
            return ModelSpec(kind=value)
        if isinstance(value, dict) and isinstance(value.get("url"), str) and isinstance(value.get("name"), str):
            extra = sorted(set(value) - {"url", "name", "api_key_env"})
            if extra:
                raise self.fail(key, f"unknown model key {extra[0]!r} (url, name, api_key_env)")
            problem = url_problem(value["url"])  # says why without the URL: it may hold a key
            if problem is not None:
                raise self.fail(key, f"url: {problem}")
            return ModelSpec("remote", value["url"], value["name"], value.get("api_key_env"))
        # The value is not echoed: a malformed spec may hold a key written where it does not belong.
        raise self.fail(key, f"expected {_KEYS[key]}, got a {type(value).__name__}")

    def key_named_in(self, message: str) -> str:
        """The task-file key a policy complaint is about (its message starts with the setting's name)."""
        aliases = {"memory_threshold": "memory_accept" if "memory_accept" in self.data else "memory_threshold"}
        for key in sorted(_KEYS, key=len, reverse=True):
            if message.startswith(key) or f" {key} " in message or message.startswith(key.replace("_", " ")):
                return aliases.get(key, key)
        return "task"

    def memory_accept(self) -> float | None:
        if self.data.get("memory_accept") is not None and self.data.get("memory_threshold") is not None:
            raise self.fail("memory_accept", "give memory_accept or memory_threshold, not both (they are one setting)")
        value = self.get("memory_accept", (int, float), None)
        if value is None:
            value = self.get("memory_threshold", (int, float), None)
        return float(value) if value is not None else None

    def client(self) -> dict[str, Any]:
        value = self.get("client", dict, {})
        unknown = sorted(set(value) - set(GilSettings.model_fields))
        if unknown:
            raise self.fail("client", f"unknown client setting {unknown[0]!r} ({', '.join(GilSettings.model_fields)})")
        try:
            load_settings(**value)
        except ConfigurationError as exc:
            raise self.fail("client", str(exc).splitlines()[0] + " " + _first_error(exc)) from exc
        return dict(value)

    def tree(self) -> Tree:
        tree_path = self.path("tree", "")
        if "tree" not in self.data:
            raise self.fail("tree", f"required ({_KEYS['tree']})")
        try:
            return load_tree(tree_path)
        except TreeFileError:
            raise
        except GilError as exc:  # pragma: no cover - load_tree raises TreeFileError only
            raise self.fail("tree", str(exc)) from exc

    def contract(self, tree: Tree) -> Contract:
        value = self.data.get("contract", "tree")
        if value == "tree":
            return TreeAnswerContract(tree)
        if value == "text":
            return TextContract()
        if isinstance(value, dict) and value.get("kind") == "text" and set(value) <= {"kind", "max_length"}:
            max_length = value.get("max_length")
            if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)):
                raise self.fail("contract", f"max_length must be an integer, got {max_length!r}")
            return TextContract(max_length=max_length)
        raise self.fail("contract", f"expected {_KEYS['contract']}, got {value!r}")

    def learned(self) -> LearnedPolicy | None:
        value = self.get("learned_reflex", dict, None)
        if value is None:
            return None
        unknown = sorted(set(value) - set(LearnedPolicy.keys()))
        if unknown:
            raise self.fail("learned_reflex", f"unknown key {unknown[0]!r} ({', '.join(LearnedPolicy.keys())})")
        if "precision" not in value:
            raise self.fail("learned_reflex", "needs precision: the share of its served judgments that must be right")
        try:
            return LearnedPolicy(**value)
        except (ConfigurationError, TypeError) as exc:
            raise self.fail("learned_reflex", str(exc)) from exc

    def thresholds(self) -> Thresholds:
        value = self.get("thresholds", dict, required=True)
        if set(value) != {"per_layer", "leaf"}:
            raise self.fail("thresholds", "needs exactly per_layer and leaf")
        per_layer = value["per_layer"]
        if (
            not isinstance(per_layer, list)
            or not all(_is_number(v) for v in per_layer)
            or not _is_number(value["leaf"])
        ):
            raise self.fail("thresholds", "per_layer is a list of numbers and leaf a number")
        try:
            return Thresholds(per_layer=tuple(float(v) for v in per_layer), leaf=float(value["leaf"]))
        except ConfigurationError as exc:
            raise self.fail("thresholds", str(exc)) from exc

    def task_file(self, path: Path) -> TaskFile:
        name = self.get("task", str, required=True)
        if not name.strip():
            raise self.fail("task", "a task needs a non-blank name (the tenant)")
        language_name = self.get("language", str, "en")
        if language_name not in LANGUAGES:
            raise self.fail("language", f"expected {_KEYS['language']}, got {language_name!r}")
        tree = self.tree()
        try:
            policy = TaskPolicy(
                thresholds=self.thresholds(),
                fallback_scope=self.get("fallback_scope", str, "path"),
                memory_threshold=self.memory_accept(),
                memory_verify=self.get("memory_verify", (int, float), None),
                verify_confidence=float(self.get("verify_confidence", (int, float), 0.8)),
                allow_fallback=self.get("allow_fallback", bool, True),
                memory_failure=self.get("memory_failure", str, "miss"),
                exploration_rate=float(self.get("exploration_rate", (int, float), 0.0)),
                show_shadows=self.get("show_shadows", bool, True),
                fallback_max_attempts=self.get("fallback_max_attempts", int, 3),
                slot_max_attempts=self.get("slot_max_attempts", int, 3),
                fallback_max_tokens=self.get("fallback_max_tokens", int, 512),
                use_tree=self.get("use_tree", bool, True),
                memory_guard=self.get("memory_guard", bool, False),
                reflex_threshold=self.get("reflex_threshold", (int, float), None),
                do_not_record=self.get("do_not_record", bool, False),
                learned=self.learned(),
            )
        except TaskFileError:
            raise
        except ConfigurationError as exc:
            raise self.fail(self.key_named_in(str(exc)), str(exc)) from exc
        examples = self.get("examples", list, [])
        task = TaskDefinition(
            name=name,
            contract=self.contract(tree),
            tree=tree,
            policy=policy,
            language=LANGUAGES[language_name],
            examples=tuple(str(example) for example in examples),
        )
        concurrency = self.get("concurrency", int, 4)
        if concurrency < 1:
            raise self.fail("concurrency", "must be at least 1")
        return TaskFile(
            task=task,
            path=path,
            chat_model=self.model("chat_model", "local"),
            embedding_model=self.model("embedding_model", "local"),
            store=self.location("store", ".gil/store"),
            memory=self.location("memory", ".gil/memory"),
            concurrency=concurrency,
            order_seed=self.get("order_seed", str, None),
            client=self.client(),
            fallback_chat_model=self.model("fallback_chat_model", "local")
            if "fallback_chat_model" in self.data
            else None,
        )


def _first_error(exc: ConfigurationError) -> str:
    """The first pydantic complaint, on one line."""
    lines = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
    return " — ".join(lines[:2])


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def store_location(value: str | Path, base: Path | None, *, path: str, key: str, line: int | None = None) -> str | Path:
    """``value`` as a store location (``gil_core.storage.location``), a relative folder joined to ``base`` (or
    left relative to the working directory without one)."""
    try:
        where = location(value)
        if isinstance(where, Path):
            # again as a Path: a string like s3:/bucket (one slash) is no URI, and no folder anyone meant
            location(where)
    except ConfigurationError as exc:
        raise TaskFileError(str(exc), path=path, line=line, key=key) from None
    return where if isinstance(where, str) or where.is_absolute() or base is None else base / where


def with_overrides(task_file: TaskFile, **changes: Any) -> TaskFile:
    """A copy of ``task_file`` with fields replaced (CLI flags applied after loading). ``store`` and ``memory``
    are checked as in the file (an ``s3://`` string stays one); a relative folder stays relative to the working
    directory, as a path given on a command line is."""
    for key in ("store", "memory"):
        if key in changes:
            changes[key] = store_location(changes[key], None, path=str(task_file.path), key=key)
    return replace(task_file, **changes)
