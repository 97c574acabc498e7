"""Per-call options (``call_options``); they live in ``gil_core.llm.options`` so the call recorder reads them too."""

from __future__ import annotations

from gil_core.llm.options import CallOptions, call_options, current_call_options

__all__ = ["CallOptions", "call_options", "current_call_options"]
