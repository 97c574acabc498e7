"""Procedure habits: the generator follows the habit's steps under a plain text contract."""

from __future__ import annotations

import pytest

from gil_core.errors import ConfigurationError
from gil_core.fallback import FallbackGenerator, run_procedure
from gil_core.language import KOREAN
from gil_core.testing import ScriptedChatModel
from tests.fallback._support import recorded, small_tree


async def test_a_procedure_is_generated_with_its_steps_as_instructions() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue("죄송합니다. 사진을 보내 주시면 교환해 드리겠습니다.")
    model, sink = recorded(scripted)
    option = small_tree().option("damaged-item")
    generation = await run_procedure(
        FallbackGenerator(model, KOREAN), "깨져서 왔어요", option, path=["returns"], node_id="returns"
    )

    assert generation.output == "죄송합니다. 사진을 보내 주시면 교환해 드리겠습니다."
    user = scripted.history[0].messages[1]["content"]
    assert user.endswith(
        "분류 경로: returns (이 범위 안에서 답하라)\n\n"
        "다음 절차에 따라 답하라:\n1. Apologise. 2. Ask for a photo of the damage. 3. Promise a replacement.\n\n"
        "자연스러운 한국어 문장으로 답하라."
    )
    assert [(call.role, call.node_id) for call in sink.calls] == [("fallback", "returns")]


async def test_only_a_procedure_can_be_run() -> None:
    generator = FallbackGenerator(ScriptedChatModel(), KOREAN)
    with pytest.raises(ConfigurationError):
        await run_procedure(generator, "hello", small_tree().option("return-window"))
