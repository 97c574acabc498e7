"""The request cache: port ``RequestCache``, the in-process adapter, and the ``CachingChatModel`` decorator."""

from gil_core.client.cache.caching_model import CacheOutcomes, CachingChatModel, is_storable, request_key
from gil_core.client.cache.in_process import DEFAULT_CAPACITY, DEFAULT_TTL_SECONDS, InProcessRequestCache
from gil_core.client.cache.ports import CacheStats, RequestCache

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_TTL_SECONDS",
    "CacheOutcomes",
    "CacheStats",
    "CachingChatModel",
    "InProcessRequestCache",
    "RequestCache",
    "is_storable",
    "request_key",
]
