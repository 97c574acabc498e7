"""Task files: one YAML file names a task, its tree, language, contract, thresholds, models and store.

Every key is documented in the README ("Task file"). The keys and their types are checked by pydantic models
(``_TaskFileKeys``; strict: YAML's own types, no coercion; an unknown key is an error), the learned judge's
section by one made from ``LearnedPolicy`` itself; what a value may be (ranges, one setting given twice) by the
task's own classes. Errors name the file, the line of the key (kept from the YAML as it is composed) and the
key, a nested one by its path (``learned_reflex.memory_cut``).
Paths in a task file are relative to the file itself; ``store`` and ``memory`` may also be ``s3://bucket/prefix``
URIs, kept as strings (a ``Path`` would fold their ``//``).
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass, field, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from gil_core._config_yaml import BoundedLoader, YAMLLimitError, misspelt, read_config_text
from gil_core.errors import ConfigurationError
from gil_core.fallback import TextContract, TreeAnswerContract
from gil_core.fallback.contracts import Contract
from gil_core.language import ENGLISH, KOREAN, PromptLanguage
from gil_core.llm._endpoint import url_problem
from gil_core.ontology import Tree, load_tree
from gil_core.settings import GilSettings, load_settings
from gil_core.storage import location
from gil_core.tasks import FallbackScope, LearnedPolicy, MemoryFailurePolicy, TaskDefinition, TaskPolicy
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
    "learned_reflex": "{precision: 0.5..1, min_support, audit_rate, novelty, unseen, window, pooling, regularization, "
    "exemplars, memory_cut, guess, llm_floor, generation_floor} or null: judge each node by the classifier learned "
    "from confirmed answers first, where the log lets it serve (memory_cut: true reads memory's cut from the same "
    "log)",
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
    if "task" not in data and "id" in data and ({"children", "options"} & set(data)):  # a tree handed over
        raise TaskFileError("a tree file, not a task file: a task file names its tree under 'tree'", path=where, line=1)
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


class _Keys(BaseModel):
    """A mapping of a task file: each key of its type as YAML wrote it (no coercion: ``"1"`` is no number, ``1``
    no text, ``1`` no ``true``); a key it does not know is an error."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _RemoteModelKeys(_Keys):
    url: str
    name: str
    api_key_env: str | None = None


class _TextContractKeys(_Keys):
    kind: Literal["text"]
    max_length: int | None = None


class _ThresholdKeys(_Keys):
    per_layer: list[float]
    leaf: float


def _keys_of(kind: type[Any], name: str) -> type[_Keys]:
    """The keys of the dataclass ``kind`` as a model: the same names, types and defaults, by construction. A
    ``float`` field takes an integer as written (``5`` stays ``5``, as in the task's recorded configuration)."""
    hints = typing.get_type_hints(kind)
    fields: dict[str, Any] = {
        item.name: (
            int | float if hints[item.name] is float else hints[item.name],
            ... if item.default is MISSING else item.default,
        )
        for item in dataclass_fields(kind)
    }
    return create_model(name, __base__=_Keys, **fields)


_LearnedKeys = _keys_of(LearnedPolicy, "_LearnedKeys")
_LEARNED_TYPES = typing.get_type_hints(LearnedPolicy)


class _TaskFileKeys(_Keys):
    """Every key of a task file (``_KEYS`` says what each holds). A key left out or null (but those of
    ``_NULL_IS_WRONG``) takes its default; a policy key's is ``TaskPolicy``'s own, None here."""

    task: str
    tree: str
    language: Literal["en", "ko"] = "en"
    contract: Literal["tree", "text"] | _TextContractKeys = "tree"
    thresholds: _ThresholdKeys
    memory_threshold: float | None = None
    memory_accept: float | None = None
    memory_verify: int | float | None = None  # as written: TaskPolicy keeps it so
    verify_confidence: float | None = None
    memory_failure: MemoryFailurePolicy | None = None
    fallback_scope: FallbackScope | None = None
    allow_fallback: bool | None = None
    use_tree: bool | None = None
    exploration_rate: float | None = None
    show_shadows: bool | None = None
    reflex_threshold: int | float | None = None
    memory_guard: bool | None = None
    learned_reflex: _LearnedKeys | None = None  # type: ignore[valid-type]
    fallback_max_attempts: int | None = None
    slot_max_attempts: int | None = None
    fallback_max_tokens: int | None = None
    examples: list[Any] | None = None
    chat_model: Literal["local"] | _RemoteModelKeys = "local"
    embedding_model: Literal["local", "hash", "none"] | _RemoteModelKeys = "local"
    store: str | Path | None = None  # a Path: an override from a command line
    memory: str | Path | None = None
    concurrency: Annotated[int, Field(ge=1)] | None = None
    order_seed: str | None = None
    do_not_record: bool | None = None
    client: dict[str, Any] | None = None
    fallback_chat_model: Literal["local"] | _RemoteModelKeys | None = None


_POLICY_KEYS = (
    "fallback_scope",
    "memory_verify",
    "verify_confidence",
    "allow_fallback",
    "memory_failure",
    "exploration_rate",
    "show_shadows",
    "fallback_max_attempts",
    "slot_max_attempts",
    "fallback_max_tokens",
    "use_tree",
    "memory_guard",
    "reflex_threshold",
    "do_not_record",
)
"""Task-file keys that are ``TaskPolicy`` fields of the same name, given to it only when the file sets them."""

_TEXT_CONTRACT = {"kind", "max_length"}
_MODEL_KEYS = ("chat_model", "embedding_model", "fallback_chat_model")
_NULL_IS_WRONG = ("task", "tree", "thresholds", "contract", "chat_model", "embedding_model")
"""Keys a null does not leave at their default: it is an error, as a value of the wrong type is."""
_LEARNED_WORDS = {bool: "true or false", int: "an integer ≥ 1", float: "a number"}


class _Reader:
    """A task file's keys checked by ``_TaskFileKeys``, then turned into a ``TaskFile``; every error names the
    file, the line of the key it is about (``lines``) and that key."""

    def __init__(self, where: str, lines: dict[str, int], data: dict[str, Any], base: Path) -> None:
        self.where, self.lines, self.data, self.base = where, lines, data, base
        if "fallback_chat_model" in data and data["fallback_chat_model"] is None:
            raise self.fail("fallback_chat_model", self.model_problem("fallback_chat_model", None))
        given = {key: value for key, value in data.items() if value is not None or key in _NULL_IS_WRONG}
        try:
            self.keys = _TaskFileKeys.model_validate(given)
        except ValidationError as exc:
            raise self.invalid(exc) from None

    def fail(self, key: str, message: str) -> TaskFileError:
        return TaskFileError(message, path=self.where, line=self.lines.get(key), key=key)

    def invalid(self, exc: ValidationError) -> TaskFileError:
        """The first of pydantic's complaints (an unknown key first, the first in name order) as today's message,
        at the line of the task-file key its location starts with."""
        errors = exc.errors()
        unknown = sorted(str(error["loc"][0]) for error in errors if error["type"] == "extra_forbidden")
        unknown = [key for key in unknown if key not in _KEYS]
        if unknown:
            return self.fail(unknown[0], f"unknown key{misspelt(unknown[0], _KEYS)} (known keys: {', '.join(_KEYS)})")
        key = str(errors[0]["loc"][0])
        return self.fail(key, self.message(key, [error for error in errors if error["loc"][0] == key]))

    def message(self, key: str, errors: list[Any]) -> str:
        """What is wrong with ``key``, from pydantic's complaints about it, worded as the task file is."""
        value = self.data.get(key)
        if len(errors[0]["loc"]) == 1 and errors[0]["type"] == "missing":
            return f"required ({_KEYS[key]})"
        if key in _MODEL_KEYS:
            return self.model_problem(key, value)
        if key == "thresholds" and isinstance(value, dict):
            if set(value) != {"per_layer", "leaf"}:
                return "needs exactly per_layer and leaf"
            return "per_layer is a list of numbers and leaf a number"
        if key == "contract" and isinstance(value, dict) and set(value) == _TEXT_CONTRACT and value["kind"] == "text":
            return f"max_length must be an integer, got {value['max_length']!r}"
        if key == "learned_reflex" and isinstance(value, dict):
            return self.learned_problem(value, errors)
        if errors[0]["type"] == "literal_error" and key in _POLICY_KEYS:
            return f"{key} must be {errors[0]['ctx']['expected']}, not {value!r}"
        if errors[0]["type"] == "greater_than_equal":
            return f"must be at least {errors[0]['ctx']['ge']}"
        return f"expected {_KEYS[key]}, got {value!r}"

    def model_problem(self, key: str, value: Any) -> str:
        if isinstance(value, str) and value in ("local", "hash", "none"):
            return f"expected {_KEYS[key]}, got {value!r}"
        if isinstance(value, dict) and isinstance(value.get("url"), str) and isinstance(value.get("name"), str):
            extra = sorted(set(value) - set(_RemoteModelKeys.model_fields))
            if extra:
                return f"unknown model key {extra[0]!r} ({', '.join(_RemoteModelKeys.model_fields)})"
        # The value is not echoed: a malformed spec may hold a key written where it does not belong.
        return f"expected {_KEYS[key]}, got a {type(value).__name__}"

    def learned_problem(self, value: dict[str, Any], errors: list[Any]) -> str:
        known = ", ".join(_LearnedKeys.model_fields)
        unknown = sorted(str(error["loc"][1]) for error in errors if error["type"] == "extra_forbidden")
        if unknown:
            return f"unknown key {unknown[0]!r}{misspelt(unknown[0], _LearnedKeys.model_fields)} ({known})"
        error = errors[0]
        name = str(error["loc"][1])
        if error["type"] == "missing":
            return f"needs {name}: the share of its served judgments that must be right"
        expected = error.get("ctx", {}).get("expected")
        if expected is not None:  # one of a few words
            return f"learned_reflex.{name} must be {expected}, not {value.get(name)!r}"
        return f"learned_reflex.{name} must be {_LEARNED_WORDS[_LEARNED_TYPES[name]]}, got {value.get(name)!r}"

    def path(self, key: str, default: str) -> Path:
        value = Path(getattr(self.keys, key) or default)
        return value if value.is_absolute() else self.base / value

    def location(self, key: str, default: str) -> str | Path:
        """An ``s3://`` URI as written (normalised), or a folder relative to the task file."""
        value = getattr(self.keys, key) or default
        return store_location(value, self.base, path=self.where, key=key, line=self.lines.get(key))

    def model(self, key: str) -> ModelSpec | None:
        value: str | _RemoteModelKeys | None = getattr(self.keys, key)
        if value is None or isinstance(value, str):
            return ModelSpec(kind=value) if value is not None else None
        problem = url_problem(value.url)  # says why without the URL: it may hold a key
        if problem is not None:
            raise self.fail(key, f"url: {problem}")
        return ModelSpec("remote", value.url, value.name, value.api_key_env)

    def key_named_in(self, message: str) -> str:
        """The task-file key a policy complaint is about (its message starts with the setting's name)."""
        aliases = {"memory_threshold": "memory_accept" if "memory_accept" in self.data else "memory_threshold"}
        for key in sorted(_KEYS, key=len, reverse=True):
            if message.startswith(key) or f" {key} " in message or message.startswith(key.replace("_", " ")):
                return aliases.get(key, key)
        return "task"

    def memory_accept(self) -> float | None:
        if self.keys.memory_accept is not None and self.keys.memory_threshold is not None:
            raise self.fail("memory_accept", "give memory_accept or memory_threshold, not both (they are one setting)")
        value = self.keys.memory_accept if self.keys.memory_accept is not None else self.keys.memory_threshold
        return float(value) if value is not None else None

    def client(self) -> dict[str, Any]:
        value = self.keys.client or {}
        unknown = sorted(set(value) - set(GilSettings.model_fields))
        if unknown:
            raise self.fail("client", f"unknown client setting {unknown[0]!r} ({', '.join(GilSettings.model_fields)})")
        try:
            load_settings(**value)
        except ConfigurationError as exc:
            raise self.fail("client", str(exc).splitlines()[0] + " " + _first_error(exc)) from exc
        return dict(value)

    def tree(self) -> Tree:
        path = self.path("tree", "")
        if not path.is_file():  # named at the task file's line; a tree that is there says its own problems
            raise self.fail("tree", f"no tree file at {path}")
        return load_tree(path)

    def contract(self, tree: Tree) -> Contract:
        value = self.keys.contract
        if value == "tree":
            return TreeAnswerContract(tree)
        if value == "text":
            return TextContract()
        assert isinstance(value, _TextContractKeys)
        return TextContract(max_length=value.max_length)

    def learned(self) -> LearnedPolicy | None:
        value = self.keys.learned_reflex
        if value is None:
            return None
        try:
            return LearnedPolicy(**value.model_dump())
        except ConfigurationError as exc:
            raise self.fail("learned_reflex", str(exc)) from exc

    def thresholds(self) -> Thresholds:
        value = self.keys.thresholds
        try:
            return Thresholds(per_layer=tuple(float(v) for v in value.per_layer), leaf=float(value.leaf))
        except ConfigurationError as exc:
            raise self.fail("thresholds", str(exc)) from exc

    def task_file(self, path: Path) -> TaskFile:
        keys = self.keys
        if not keys.task.strip():
            raise self.fail("task", "a task needs a non-blank name (the tenant)")
        tree = self.tree()
        given = {key: getattr(keys, key) for key in _POLICY_KEYS if getattr(keys, key) is not None}
        try:
            policy = TaskPolicy(
                thresholds=self.thresholds(),
                memory_threshold=self.memory_accept(),
                learned=self.learned(),
                **given,
            )
        except TaskFileError:
            raise
        except ConfigurationError as exc:
            raise self.fail(self.key_named_in(str(exc)), str(exc)) from exc
        task = TaskDefinition(
            name=keys.task,
            contract=self.contract(tree),
            tree=tree,
            policy=policy,
            language=LANGUAGES[keys.language],
            examples=tuple(str(example) for example in keys.examples or ()),
        )
        return TaskFile(
            task=task,
            path=path,
            chat_model=self.model("chat_model") or ModelSpec(kind="local"),
            embedding_model=self.model("embedding_model") or ModelSpec(kind="local"),
            store=self.location("store", ".gil/store"),
            memory=self.location("memory", ".gil/memory"),
            concurrency=keys.concurrency if keys.concurrency is not None else 4,
            order_seed=keys.order_seed,
            client=self.client(),
            fallback_chat_model=self.model("fallback_chat_model"),
        )


def _first_error(exc: ConfigurationError) -> str:
    """The first pydantic complaint, on one line."""
    lines = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
    return " — ".join(lines[:2])


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
