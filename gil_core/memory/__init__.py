"""Memory: confirmed answers per task, asked before the tree. One port (``Memory``) and its adapters.

- ``LanceDBMemory``: embeddings in one LanceDB table, exact float64 cosine per task; on a local store a
  lookup in a fresh process answers from the task's snapshot beside the table while it is current, without
  importing LanceDB.
- ``LexicalMemory``: character 2–3-gram TF-IDF cosine, no model (its own similarity scale).
- ``CircuitBreakingMemory``: stops calling a failing memory for a cooldown.
- ``CallableEmbeddingModel``: any embedding function as an ``EmbeddingModel``.
- ``plan_memory`` / ``rebuild_memory``: what memory holds after a history of verdicts.

LanceDB and scikit-learn are imported on first use, so importing this package stays cheap.
"""

from gil_core.memory.breaker import BreakerState, CircuitBreakingMemory
from gil_core.memory.embedders import CallableEmbeddingModel, EmbeddingFunction
from gil_core.memory.evidence import EntryEvidence, MemoryEvidence, wilson_lower_bound
from gil_core.memory.guard import GuardVerdict, HitGuard
from gil_core.memory.lance_tables import MemoryCompaction, compact_memory
from gil_core.memory.lancedb_memory import LanceDBMemory
from gil_core.memory.lexical_memory import LexicalMemory
from gil_core.memory.ports import Memory, MemoryChanges, MemoryEntry, Recall
from gil_core.memory.replay import FeedbackEvent, Verdict, plan_memory, rebuild_memory

__all__ = [
    "BreakerState",
    "CallableEmbeddingModel",
    "CircuitBreakingMemory",
    "EmbeddingFunction",
    "EntryEvidence",
    "FeedbackEvent",
    "GuardVerdict",
    "HitGuard",
    "LanceDBMemory",
    "LexicalMemory",
    "Memory",
    "MemoryChanges",
    "MemoryCompaction",
    "MemoryEntry",
    "MemoryEvidence",
    "Recall",
    "Verdict",
    "compact_memory",
    "plan_memory",
    "rebuild_memory",
    "wilson_lower_bound",
]
