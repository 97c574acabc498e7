"""Gil: confirmed-answer memory and one-token judgments in front of an LLM."""

__version__ = "0.1.0"
