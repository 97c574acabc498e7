"""The single-token judge: label schemes in prompts, the order seed, and the label distribution."""

from gil_core.judge.distribution import DEFAULT_TRUST_THRESHOLD, LabelDistribution, read_distribution
from gil_core.judge.primitives import (
    ChatPrimitives,
    Choice,
    EmbeddingChooser,
    InvalidJudgmentError,
    Score,
    YesNo,
)
from gil_core.judge.prompt import Candidate, build_judge_messages, label_candidates, order_candidates
from gil_core.judge.reflex import ReflexJudge, TieredJudge, TieredJudgment
from gil_core.judge.router import JudgmentRouter, JudgmentScope, Routed, RouterThresholds
from gil_core.judge.single_token import TOP_LOGPROBS, Judge, Judgment, SingleTokenJudge
from gil_core.judge.verify import SameRequestVerifier, Verifier

__all__ = [
    "DEFAULT_TRUST_THRESHOLD",
    "TOP_LOGPROBS",
    "Candidate",
    "ChatPrimitives",
    "Choice",
    "EmbeddingChooser",
    "InvalidJudgmentError",
    "Judge",
    "Judgment",
    "JudgmentRouter",
    "JudgmentScope",
    "LabelDistribution",
    "ReflexJudge",
    "Routed",
    "RouterThresholds",
    "SameRequestVerifier",
    "Score",
    "SingleTokenJudge",
    "TieredJudge",
    "TieredJudgment",
    "Verifier",
    "YesNo",
    "build_judge_messages",
    "label_candidates",
    "order_candidates",
    "read_distribution",
]
