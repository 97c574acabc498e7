"""The JSON columns a row is written with: the text of ``json.dumps(value, ensure_ascii=False, separators=(",", ":"),
allow_nan=False)`` whatever the value, the candidates a node shows written alike whether or not their text was kept,
and a value that cannot be written refused without spoiling the next one."""

from __future__ import annotations

import json
import math
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gil_core.errors import SchemaViolationError
from gil_core.telemetry._rows import _to_json, call_row
from gil_core.telemetry.records import CallRecord, CandidateShown

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


def dumped(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@given(values)
def test_a_value_is_written_as_json_dumps_writes_it(value: Any) -> None:
    assert _to_json(value, "calls", "raw") == dumped(value)


def test_a_value_json_cannot_hold_is_refused_and_the_next_is_written() -> None:
    looped: list[Any] = [1]
    looped.append(looped)
    for bad in ([{"p": math.nan}], looped, [{"x": object()}]):
        with pytest.raises(SchemaViolationError, match="cannot be written as JSON"):
            _to_json(bad, "traces", "path")
        assert _to_json([{"p": 0.5}], "traces", "path") == '[{"p":0.5}]'


def test_values_written_from_several_threads_at_once_are_each_their_own() -> None:
    found: list[bool] = []

    def write(index: int) -> None:
        value = [{"token": str(index), "logprob": -index / 7, "nested": [index] * 5}]
        found.extend(_to_json(value, "calls", "top_logprobs") == dumped(value) for _ in range(2000))

    threads = [threading.Thread(target=write, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 8000 and all(found)


def test_the_candidates_shown_are_written_alike_as_a_tuple_or_a_list() -> None:
    shown = (CandidateShown(None, "A"), CandidateShown("billing", "B", "Billing", "Invoices — paid?", "ok"))
    call = CallRecord("c", "t", datetime.now(UTC), "judge", "m", candidates=shown)
    as_list = CallRecord("c", "t", call.created_at, "judge", "m", candidates=list(shown))
    expected = dumped([
        {"id": item.id, "shown_as": item.shown_as, "label": item.label, "description": item.description,
         "answer": item.answer}
        for item in shown
    ])  # fmt: skip
    assert call_row(call)["candidates"] == call_row(call)["candidates"] == call_row(as_list)["candidates"] == expected
