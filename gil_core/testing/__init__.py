"""Fakes that behave like the real thing, for tests of Gil and of code built on it.

They are working implementations, not mocks: ``ScriptedChatModel`` answers from a script the way the HTTP
adapter would (logprobs only when asked, typed errors on failure), ``HashEmbeddingModel`` embeds
deterministically without a model, and ``ScriptedOpenAIServer`` speaks the OpenAI-compatible protocol on
loopback, so the httpx adapters are tested over a real socket, failure modes included.
"""

from gil_core.telemetry.compat_fixture import write_compat_fixture
from gil_core.testing._script import FailureKind, ScriptedReply
from gil_core.testing.hash_embedding import HashEmbeddingModel
from gil_core.testing.manual_clock import ManualClock
from gil_core.testing.scripted_chat import ScriptedCall, ScriptedChatModel
from gil_core.testing.scripted_server import ReceivedRequest, ScriptedOpenAIServer, StreamedReply

__all__ = [
    "FailureKind",
    "HashEmbeddingModel",
    "ManualClock",
    "ReceivedRequest",
    "ScriptedCall",
    "ScriptedChatModel",
    "ScriptedOpenAIServer",
    "ScriptedReply",
    "StreamedReply",
    "write_compat_fixture",
]
