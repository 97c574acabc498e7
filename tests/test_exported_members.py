"""The public names of each gil_core package, pinned: removing or renaming one is an API change (CHANGELOG)."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "gil_core.errors": [
        "BadResponseError",
        "ConfigurationError",
        "GilError",
        "LabelCapacityError",
        "ModelError",
        "ModelUnavailableError",
        "RateLimitedError",
        "SchemaViolationError",
        "TelemetryError",
        "TreeFileError",
    ],
    "gil_core.diagnostics": [
        "INSTRUMENTATION_NAME",
        "CallSpan",
        "Diagnostics",
        "MemoryOutcome",
        "ResolveSpan",
        "default_diagnostics",
    ],
    "gil_core.fallback": [
        "Accepted",
        "ChoiceContract",
        "Contract",
        "FallbackGenerator",
        "Generation",
        "ScoreContract",
        "SlotFill",
        "SlotFiller",
        "TextContract",
        "TreeAnswerContract",
        "Verdict",
        "Violation",
        "build_fallback_messages",
        "build_slot_messages",
        "run_procedure",
    ],
    "gil_core.habits": ["Evidence", "ReliabilityDelta", "attribute_verdict", "build_shadow_index", "confirmed_answer"],
    "gil_core.language": ["ENGLISH", "KOREAN", "PromptLanguage", "fill", "placeholders"],
    "gil_core.ontology": [
        "LabelScheme",
        "LintFinding",
        "Node",
        "Option",
        "OptionKind",
        "Origin",
        "Slot",
        "Tree",
        "TreeLintWarning",
        "check_tree",
        "dump_tree",
        "lint_tree",
        "load_tree",
        "parse_tree",
        "write_tree",
    ],
    "gil_core.llm": [
        "CallRecorder",
        "CallScope",
        "ChatModel",
        "Completion",
        "EmbeddingModel",
        "EmbeddingRecorder",
        "Embeddings",
        "Message",
        "OpenAICompatibleChatModel",
        "OpenAICompatibleEmbeddingModel",
        "ServerTimings",
        "TokenLogprob",
        "Usage",
        "call_scope",
        "current_trace_id",
        "trace_scope",
    ],
    "gil_core.judge": [
        "DEFAULT_TRUST_THRESHOLD",
        "TOP_LOGPROBS",
        "Candidate",
        "Judge",
        "Judgment",
        "LabelDistribution",
        "SingleTokenJudge",
        "build_judge_messages",
        "label_candidates",
        "order_candidates",
        "read_distribution",
    ],
    "gil_core.traverse": ["ExitReason", "GreedyTraverser", "Step", "StepOutcome", "Thresholds", "Traversal"],
    "gil_core.telemetry": [
        "COLUMNS",
        "COUNTERS",
        "KEYS",
        "TABLES",
        "CallRecord",
        "CallRole",
        "CallSink",
        "CandidateShown",
        "EnergyModel",
        "TelemetryStore",
        "TraceRecord",
        "TraceSink",
        "utc_now",
        "validate_frame",
    ],
    "gil_core.testing": [
        "FailureKind",
        "HashEmbeddingModel",
        "ReceivedRequest",
        "ScriptedCall",
        "ScriptedChatModel",
        "ScriptedOpenAIServer",
        "ScriptedReply",
    ],
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_exported_members(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(PUBLIC[module_name])
    for name in module.__all__:
        assert hasattr(module, name), name
