"""The learned reflex: per tree node, a classifier learned from confirmed answers, served where the log shows it
meets the task's precision or beats the LLM (``gil_core.learned.fit``), kept current after every feedback
(``gil_core.learned.learner``), and judged on the request path with numpy alone (``gil_core.learned.judge``).
The task's ``learned_reflex`` key (``gil_core.tasks.LearnedPolicy``) turns it on; with memory on, memory's
similarity cut is read from the same log (``gil_core.learned.memory_cut``). The feedback queue
(``gil_core.learned.queue``) asks for the verdicts that would teach it most."""

from gil_core.learned.fit import fit_state, node_rows, prior_texts
from gil_core.learned.judge import LearnedJudge, LearnedJudgment, audited, served_answer, unlike_at_root
from gil_core.learned.learner import (
    LearnedStateWarning,
    Learner,
    describe_nodes,
    memory_configured,
    stored_state,
    task_key,
)
from gil_core.learned.log import Confirmed, LearnedLog, Logged, VerdictDigest, read_learned_log, verdict_digest
from gil_core.learned.memory_cut import MemoryCut, fit_memory_cut
from gil_core.learned.queue import (
    DEFAULT_RANDOM_SHARE,
    ChosenBy,
    FeedbackQueue,
    QueueItem,
    QueueWeights,
    Teaching,
    Unconfirmed,
    choose_queue,
    issue_queue,
    read_chosen_by,
    read_unconfirmed,
    read_waiting,
    teaching_value,
)
from gil_core.learned.rules import choose_rule
from gil_core.learned.state import SIGNIFICANCE, LearnedState, NodeModel, Prediction, read_state, write_state

__all__ = [
    "DEFAULT_RANDOM_SHARE",
    "SIGNIFICANCE",
    "ChosenBy",
    "Confirmed",
    "FeedbackQueue",
    "LearnedJudge",
    "LearnedJudgment",
    "LearnedLog",
    "LearnedState",
    "LearnedStateWarning",
    "Learner",
    "Logged",
    "MemoryCut",
    "NodeModel",
    "Prediction",
    "QueueItem",
    "QueueWeights",
    "Teaching",
    "Unconfirmed",
    "VerdictDigest",
    "audited",
    "choose_queue",
    "choose_rule",
    "describe_nodes",
    "fit_memory_cut",
    "fit_state",
    "issue_queue",
    "memory_configured",
    "node_rows",
    "prior_texts",
    "read_chosen_by",
    "read_learned_log",
    "read_state",
    "read_unconfirmed",
    "read_waiting",
    "served_answer",
    "stored_state",
    "task_key",
    "teaching_value",
    "unlike_at_root",
    "verdict_digest",
    "write_state",
]
