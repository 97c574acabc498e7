"""Negated requests and the learned judge (issue #19, case 13): the embedder barely sees "don't", so a negated
request lands beside the confirmed requests of its positive form. Where no confirmed request of the predicted
class negates, the learned judge defers (the LLM judges), and the rest of its serving is unchanged."""

from __future__ import annotations

import itertools
from pathlib import Path

from gil_core.learned import served_answer
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.memory.guard import has_negation
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from tests.learned._support import bad_model, embedder, learned_task, train

NEGATED = [
    "I don't want a refund for order 48213, please keep it as it is.",
    "Please do not send me the invoice for order 55120.",
    "I do not want to close my account, keep it open.",
    "I don't want to change my email address.",
    "Do not turn on two-step sign-in for me.",
    "I don't need a return label for order 77421.",
    "I don't want to return the headphones, I'm keeping them.",
    "I don't need to know how long delivery takes.",
    "I don't want to know which cards you accept.",
    "Do not tell me where order 31870 is, I already have it.",
    "I'm not asking what shipping costs.",
    "I don't want a copy of my invoice.",
]


async def test_learned_judge_defers_a_negated_request_where_its_class_never_saw_one(tmp_path: Path) -> None:
    task = learned_task()
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await train(resolver, task, 200, chunk=50)
            assert resolver.learner is not None
            state = await resolver.learner.serving_state(task)
            vectors = [await resolver.learner.request_vector(text) for text in NEGATED]
            resolutions = [await resolver.resolve(task, text) for text in NEGATED]
    assert all(has_negation(text) for text in NEGATED)
    blind = [served_answer(state, task.tree, vector) for vector in vectors]  # as if "don't" were not there
    checked = [served_answer(state, task.tree, vector, negates=True) for vector in vectors]
    served_blind = sum(served and option is not None for served, option in blind)
    served_checked = sum(served and option is not None for served, option in checked)
    assert served_blind >= 6  # without the check, most of them go to the positive form's answer
    deferred = sum(any(step.learned and step.learned["why"] == "negated" for step in r.path) for r in resolutions)
    assert served_checked < served_blind and deferred >= served_blind - served_checked
    for served, option in checked:  # what is still served went where confirmed requests did negate
        if served and option is not None:
            path = [node.id for node in task.tree.path_to(task.tree.owner(option).id)] + [option]
            for node, child in itertools.pairwise(path):
                model = state.nodes[node]
                assert model.negated[model.classes.index(child)] > 0
