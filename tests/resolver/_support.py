"""A scripted OpenAI-compatible server that answers like a well-behaved model for the support tree.

Judge requests pick the shown label whose text is the next step of the request's route (or "none");
slot-fill requests get the request's scripted JSON; generation requests get the request's scripted answers
in order. Everything travels over real HTTP on loopback.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gil_core.fallback import TreeAnswerContract
from gil_core.language import ENGLISH
from gil_core.ontology import Tree, TreeLintWarning, load_tree
from gil_core.tasks import TaskDefinition, TaskPolicy
from gil_core.testing import ScriptedOpenAIServer, ScriptedReply
from gil_core.traverse import Thresholds

ROOT = Path(__file__).resolve().parents[2]
_CHOICE = re.compile(r"^(\S)\. (.+?) — ", re.MULTILINE)
_REQUEST = re.compile(r"<request>\n(.*)\n</request>", re.DOTALL)


@dataclass
class Script:
    """How the model behaves for one request. Answers are given in order; the last one repeats."""

    route: Sequence[str] = ()
    answers: list[str] = field(default_factory=list)
    slots: Mapping[str, str] | None = None


class SupportModel:
    """The responder behind ``ScriptedOpenAIServer``: routes by label, fills slots, answers generation."""

    def __init__(self, scripts: Mapping[str, Script], default: Script | None = None) -> None:
        self.scripts = scripts
        self.default = default

    def __call__(self, body: Mapping[str, Any]) -> ScriptedReply:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        match = _REQUEST.search(user)
        text = match.group(1) if match else ""
        script = self.scripts[text] if text in self.scripts or self.default is None else self.default
        if body.get("logprobs"):
            choices = dict((label, symbol) for symbol, label in _CHOICE.findall(user))
            none_symbol = user.split("</request>\n\n", 1)[1].splitlines()[1][0]
            symbol = next((choices[step] for step in script.route if step in choices), none_symbol)
            others = [s for s in [none_symbol, *choices.values()] if s != symbol]
            alternatives = [(symbol, math.log(0.96))] + [(s, math.log(0.04 / len(others))) for s in others]
            return ScriptedReply(symbol, top_logprobs=alternatives)
        if system == ENGLISH.slot_system:
            return ScriptedReply(json.dumps(script.slots))
        return ScriptedReply(script.answers.pop(0) if len(script.answers) > 1 else script.answers[0])


def support_tree() -> Tree:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return load_tree(ROOT / "ontologies" / "support.yaml")


def support_task(name: str = "support", *, memory_threshold: float | None = 0.95, **policy: Any) -> TaskDefinition:
    tree = support_tree()
    return TaskDefinition(
        name=name,
        contract=TreeAnswerContract(tree),
        tree=tree,
        policy=TaskPolicy(
            thresholds=Thresholds(per_layer=(0.6,), leaf=0.7), memory_threshold=memory_threshold, **policy
        ),
        language=ENGLISH,
    )


def support_server(scripts: Mapping[str, Script], default: Script | None = None) -> ScriptedOpenAIServer:
    return ScriptedOpenAIServer(responder=SupportModel(scripts, default))
