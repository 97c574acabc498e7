"""The rate limiter: port ``RateLimiter``, the token-bucket adapter, and the ``LimitedChatModel`` decorator."""

from gil_core.client.limiter.limited_model import TRANSIENT_ERRORS, LimitedChatModel
from gil_core.client.limiter.ports import LimiterRefusedError, LimiterSnapshot, RateLimiter
from gil_core.client.limiter.token_bucket import (
    DEFAULT_BURST,
    DEFAULT_MAX_WAIT_SECONDS,
    DEFAULT_REQUESTS_PER_SECOND,
    TokenBucketLimiter,
)

__all__ = [
    "DEFAULT_BURST",
    "DEFAULT_MAX_WAIT_SECONDS",
    "DEFAULT_REQUESTS_PER_SECOND",
    "TRANSIENT_ERRORS",
    "LimitedChatModel",
    "LimiterRefusedError",
    "LimiterSnapshot",
    "RateLimiter",
    "TokenBucketLimiter",
]
