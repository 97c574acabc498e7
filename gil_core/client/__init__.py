"""Around every model call: a request cache, a rate limiter and an operation log, each a decorator over the
``ChatModel`` port (so the resolver never knows they are there), with per-call options beside the call."""

from gil_core.client.cache import (
    CacheOutcomes,
    CacheStats,
    CachingChatModel,
    InProcessRequestCache,
    RequestCache,
    is_storable,
    request_key,
)
from gil_core.client.limiter import (
    LimitedChatModel,
    LimiterRefusedError,
    LimiterSnapshot,
    RateLimiter,
    TokenBucketLimiter,
)
from gil_core.client.oplog import (
    InProcessOperationLog,
    JsonLinesOperationLog,
    LoggedChatModel,
    OperationEntry,
    OperationLog,
    OperationStats,
    RecalledOperation,
)
from gil_core.client.options import CallOptions, call_options, current_call_options
from gil_core.client.stack import build_chat_stack

__all__ = [
    "CacheOutcomes",
    "CacheStats",
    "CachingChatModel",
    "CallOptions",
    "InProcessOperationLog",
    "InProcessRequestCache",
    "JsonLinesOperationLog",
    "LimitedChatModel",
    "LimiterRefusedError",
    "LimiterSnapshot",
    "LoggedChatModel",
    "OperationEntry",
    "OperationLog",
    "OperationStats",
    "RateLimiter",
    "RecalledOperation",
    "RequestCache",
    "TokenBucketLimiter",
    "build_chat_stack",
    "call_options",
    "current_call_options",
    "is_storable",
    "request_key",
]
