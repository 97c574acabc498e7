"""What a task is: its tree, its output contract, its language, and the policy the resolver follows for it."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Literal

from gil_core.errors import ConfigurationError
from gil_core.fallback.contracts import (
    ChoiceContract,
    Contract,
    ScoreContract,
    TextContract,
    TreeAnswerContract,
)
from gil_core.language import ENGLISH, PromptLanguage
from gil_core.ontology.files import dump_tree
from gil_core.ontology.model import Tree
from gil_core.traverse import Thresholds

__all__ = [
    "FallbackScope",
    "LearnedPolicy",
    "MemoryFailurePolicy",
    "Pooling",
    "Resolution",
    "TaskDefinition",
    "TaskPolicy",
]

FallbackScope = Literal["path", "full"]
MemoryFailurePolicy = Literal["miss", "error"]


Pooling = Literal["layer", "node"]


@dataclass(frozen=True, slots=True)
class LearnedPolicy:
    """The task file's ``learned_reflex`` key.

    ``precision`` (required: a threshold is a decision about precision) is the share of the learned judge's
    served judgments that must be right. A node serves under the rule "proven" when the Wilson 95% lower bound of
    its logged precision at some confidence cut reaches it, or "better" when, at a cut whose logged precision
    reaches it, the LLM judged the same requests significantly worse (a one-sided sign test at 95%).

    * ``min_support``: a node with fewer logged predictions than this reads the pooled evidence of the nodes of
      its layer (``pooling: layer``), or only its own (``pooling: node``).
    * ``audit_rate``: share of served judgments the LLM also judges, recorded and not served, so the comparison
      with the LLM stays current.
    * ``novelty``: the share of confirmed requests the novelty cut may refuse: a request less similar to every
      confirmed request of the class it is predicted as than that quantile of what confirmed requests were to
      their predecessors is not served.
    * ``unseen``: the share of a category the tree does not hold that may be served as another, estimated at each
      refit by leaving each confirmed category out in turn; the root's cuts rise until it holds.
    * ``window``: the latest logged predictions per node the rules read.
    * ``regularization``: the inverse regularisation strength ``C`` of the logistic regression (100: on unit-length
      sentence vectors, 10 underfits; docs/learned-reflex.md, "The classifier's regularisation").
    * ``exemplars``: confirmed requests kept per class for the novelty check (the most recent ones).
    * ``memory_cut``: read memory's similarity cut from the same log for ``precision`` (``learned.memory_cut``);
      false keeps the task's ``memory_threshold`` as it is.
    * ``guess``: below the root, where the learned judge may not serve and the LLM (or the description reflex)
      does not settle the node either, the learned judge's choice settles it when the log shows the LLM there
      significantly worse than the learned judge (the sign test of "better") and the request is not novel:
      a worse judge's exit should not send the request to generation. False: such a node exits as before.
    * ``llm_floor``: where the learned judge does not serve, the next judge (the description reflex, or the LLM)
      is not asked at a node whose log shows, at 95% (the Wilson upper bound), that it settled fewer than this
      share of the requests it was asked there with the confirmed child; the ``audit_rate`` share of them is
      still asked, so the evidence stays current. Such a node exits unless a guess settles it. 0: always asked.
      While the next judge settled none of a node's own requests right, its layer's asks and then the tree's
      (``pooling: layer``) decide when they fall under the floor.
    * ``generation_floor``: where the tree does not settle a request, generation is not asked when the log shows,
      at 95% (the Wilson upper bound), that it generated the confirmed answer for fewer than this share of the
      latest ``window`` requests it was asked; the ``audit_rate`` share is still asked, so the evidence stays
      current. Such a request ends as abstain (``learned.generation_floor``). 0: always asked.
    """

    precision: float
    min_support: int = 20
    audit_rate: float = 0.05
    novelty: float = 0.05
    unseen: float = 0.03
    window: int = 500
    pooling: Pooling = "layer"
    regularization: float = 100.0
    exemplars: int = 64
    memory_cut: bool = True
    guess: bool = True
    llm_floor: float = 0.05
    generation_floor: float = 0.05

    def __post_init__(self) -> None:
        for name in ("precision", "audit_rate", "novelty", "unseen", "llm_floor", "generation_floor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigurationError(f"learned_reflex.{name} must be a number, got {value!r}")
        if not 0.5 <= self.precision < 1.0:
            raise ConfigurationError(f"learned_reflex.precision must lie in [0.5, 1), got {self.precision!r}")
        if not 0.0 <= self.audit_rate <= 1.0:
            raise ConfigurationError(f"learned_reflex.audit_rate must lie in [0, 1], got {self.audit_rate!r}")
        if not 0.0 <= self.novelty < 1.0:
            raise ConfigurationError(f"learned_reflex.novelty must lie in [0, 1), got {self.novelty!r}")
        if not 0.0 <= self.unseen <= 1.0:
            raise ConfigurationError(f"learned_reflex.unseen must lie in [0, 1], got {self.unseen!r}")
        for name in ("llm_floor", "generation_floor"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigurationError(f"learned_reflex.{name} must lie in [0, 1), got {getattr(self, name)!r}")
        for name in ("min_support", "window", "exemplars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"learned_reflex.{name} must be an integer ≥ 1, got {value!r}")
        for name in ("memory_cut", "guess"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"learned_reflex.{name} must be true or false, got {getattr(self, name)!r}")
        if self.pooling not in ("layer", "node"):
            raise ConfigurationError(f"learned_reflex.pooling must be 'layer' or 'node', not {self.pooling!r}")
        if not (math.isfinite(self.regularization) and self.regularization > 0):
            raise ConfigurationError(f"learned_reflex.regularization must be > 0, got {self.regularization!r}")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(cls.__dataclass_fields__)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TaskPolicy:
    """How the resolver treats one task.

    ``thresholds`` has no default: accepting a judgment is a decision about precision. ``memory_threshold``
    None turns memory off. ``fallback_scope`` "path" narrows generation to the last confirmed category first.
    ``memory_failure`` "miss" lets a failed lookup pass as a miss; "error" fails the request.
    ``exploration_rate`` is the share of habit answers cross-checked against full generation.
    ``use_tree`` False sends every request straight to full generation: the baseline the tree is measured against.
    ``memory_guard`` refuses a memory hit whose request differs from the remembered one in a negation, a number
    or an amount (see ``gil_core.memory.guard``). ``reflex_threshold`` set: each node is judged first by the
    embedding reflex judge, and the LLM only when the reflex's confidence is below it (needs an embedder).
    ``do_not_record`` keeps every request's text out of every table, log and cache (``Resolver.resolve``).
    ``learned`` set: each node is first judged by the classifier learned from confirmed answers, where the log
    lets it serve (``gil_core.learned``; needs an embedder), before the reflex and the LLM.

    Verified memory hits: with ``memory_verify`` set (below ``memory_threshold``, which is then the *accept*
    threshold), a hit with similarity in [memory_verify, memory_threshold) is served only when a one-token
    yes/no judgment says the two requests ask for the same thing with confidence ≥ ``verify_confidence``. An
    entry whose hits keep being confirmed may skip the verification down to a per-entry threshold (see
    ``gil_core.memory.evidence``), never below ``memory_verify``. Neither threshold has a default: choose them
    from the log (``gil_core.habits.thresholds.select_memory_bands``).
    """

    thresholds: Thresholds
    fallback_scope: FallbackScope = "path"
    memory_threshold: float | None = None
    allow_fallback: bool = True
    memory_failure: MemoryFailurePolicy = "miss"
    exploration_rate: float = 0.0
    show_shadows: bool = True
    use_tree: bool = True
    memory_guard: bool = False
    reflex_threshold: float | None = None
    fallback_max_attempts: int = 3
    slot_max_attempts: int = 3
    fallback_max_tokens: int = 512
    do_not_record: bool = False
    memory_verify: float | None = None
    verify_confidence: float = 0.8
    learned: LearnedPolicy | None = None

    def __post_init__(self) -> None:
        if self.fallback_scope not in ("path", "full"):
            raise ConfigurationError(f"fallback_scope must be 'path' or 'full', not {self.fallback_scope!r}")
        if self.memory_failure not in ("miss", "error"):
            raise ConfigurationError(f"memory_failure must be 'miss' or 'error', not {self.memory_failure!r}")
        if self.memory_threshold is not None and not (
            math.isfinite(self.memory_threshold) and -1.0 <= self.memory_threshold <= 1.0
        ):
            raise ConfigurationError(f"memory_threshold must lie in [-1, 1], got {self.memory_threshold!r}")
        if self.memory_verify is not None:
            if self.memory_threshold is None:
                raise ConfigurationError("memory_verify needs memory_threshold (memory_accept) to be set")
            if not (math.isfinite(self.memory_verify) and -1.0 <= self.memory_verify <= self.memory_threshold):
                raise ConfigurationError(
                    f"memory_verify must lie in [-1, memory_accept={self.memory_threshold}], got {self.memory_verify!r}"
                )
        if not (math.isfinite(self.verify_confidence) and 0.0 <= self.verify_confidence <= 1.0):
            raise ConfigurationError(f"verify_confidence must lie in [0, 1], got {self.verify_confidence!r}")
        if not (math.isfinite(self.exploration_rate) and 0.0 <= self.exploration_rate <= 1.0):
            raise ConfigurationError(f"exploration_rate must lie in [0, 1], got {self.exploration_rate!r}")
        for name in ("fallback_max_attempts", "slot_max_attempts", "fallback_max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be at least 1")


@dataclass(frozen=True)
class TaskDefinition:
    """A named task (the tenant): memory, stats and caches never cross task names."""

    name: str
    contract: Contract
    tree: Tree
    policy: TaskPolicy
    language: PromptLanguage = ENGLISH
    examples: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ConfigurationError("a task needs a non-blank name")

    @cached_property
    def schema(self) -> str:
        """The SHA-256 of ``config()``: request caches key on it, so a changed tree or policy misses."""
        text = json.dumps(self._config, ensure_ascii=False, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def config(self) -> dict[str, Any]:
        """The task's configuration as stored in ``run_configs`` (the tree by its SHA-256)."""
        return dict(self._config)

    @cached_property
    def _config(self) -> dict[str, Any]:
        # Dumping the tree to hash it is the slow part; a definition is immutable, so do it once.
        policy = self.policy
        return {
            "language": self.language.name,
            "contract": _describe_contract(self.contract),
            "tree_sha256": hashlib.sha256(dump_tree(self.tree).encode("utf-8")).hexdigest(),
            "per_layer": list(policy.thresholds.per_layer),
            "leaf": policy.thresholds.leaf,
            "fallback_scope": policy.fallback_scope,
            "memory_threshold": policy.memory_threshold,
            "allow_fallback": policy.allow_fallback,
            "memory_failure": policy.memory_failure,
            "exploration_rate": policy.exploration_rate,
            "show_shadows": policy.show_shadows,
            "use_tree": policy.use_tree,
            "memory_guard": policy.memory_guard,
            "reflex_threshold": policy.reflex_threshold,
            "fallback_max_attempts": policy.fallback_max_attempts,
            "slot_max_attempts": policy.slot_max_attempts,
            "fallback_max_tokens": policy.fallback_max_tokens,
            "do_not_record": policy.do_not_record,
            "memory_verify": policy.memory_verify,
            "verify_confidence": policy.verify_confidence,
            "examples": list(self.examples),
        } | ({"learned_reflex": policy.learned.to_json()} if policy.learned is not None else {})


def _describe_contract(contract: Contract) -> dict[str, Any]:
    if isinstance(contract, TreeAnswerContract):
        return {"kind": "tree", "scope": contract.scope}
    if isinstance(contract, TextContract):
        return {"kind": "text", "max_length": contract.max_length}
    if isinstance(contract, ChoiceContract):
        return {"kind": "choice", "choices": list(contract.choices)}
    if isinstance(contract, ScoreContract):
        return {"kind": "score", "low": contract.low, "high": contract.high}
    return {"kind": type(contract).__name__}


@dataclass(frozen=True)
class Resolution:
    """What ``resolve`` returns: the stored trace's essentials."""

    trace_id: str
    task: str
    mode: str
    output: str | None
    confidence: float | None
    path: tuple[Any, ...] = ()
    energy: float = 0.0
    recall: Any = None
    failure: str | None = None
    habit: str | None = None
    explored_output: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
