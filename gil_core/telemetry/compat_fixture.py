"""A small synthetic telemetry store and its SQLite export, for checking that another implementation of the
reference's layout reads ours (``GIL_COMPAT_FIXTURE`` chooses where the test writes it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gil_core.errors import ConfigurationError

__all__ = ["write_compat_fixture"]


def write_compat_fixture(directory: Path) -> tuple[Path, Path]:
    """Write a small synthetic telemetry store and its SQLite export into ``directory``; return both paths.

    Every table is non-empty and every value is fixed, so the export is the same on every run: a file to hand to
    another implementation of the layout (the reference) to check it reads ours. The values are awkward on
    purpose: Korean text, quotes and newlines, nulls, a −∞ logprob (``null`` in JSON), integers past 2**53,
    microsecond timestamps, a superseded trace, counters written as several increments. The store is
    ``directory/store`` (a fixture written there before is replaced) and the export ``directory/telemetry.sqlite``.
    """
    import shutil
    from datetime import UTC, datetime, timedelta

    from gil_core.telemetry import COLUMNS, CallRecord, CandidateShown, TelemetryStore, TraceRecord
    from gil_core.telemetry.sqlite import export_sqlite

    root = Path(directory) / "store"
    if root.exists():
        strangers = sorted(entry.name for entry in root.iterdir() if entry.name not in COLUMNS)
        if strangers:  # never delete what this function did not write
            raise ConfigurationError(f"{root} holds {strangers}: not a compat fixture store, left as is")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    store = TelemetryStore(root)
    at = datetime(2026, 11, 30, 9, 34, 4, 123456, tzinfo=UTC)
    judge = CallRecord(
        call_id="call-0001", trace_id="trace-0001", created_at=at, role="judge", model="smollm2-135m",
        node_id="root", layer=1, prompt_tokens=181, cached_tokens=128, completion_tokens=1, latency_ms=12.5,
        gpu_prompt_ms=3.25, gpu_predicted_ms=0.75, content="B", first_token="B",
        top_logprobs=(("B", -0.105), (" A", -2.25), ("Z", None)), distribution={"B": 0.9, "A": 0.1},
        label_mass=0.9375, confidence=0.9, outcome="accept", energy=24.5,
        raw_response='{"choices":[{"text":"B"}],"note":"환불 \\"급함\\""}',
        candidates=(
            CandidateShown(id=None, shown_as="A", label="해당 없음"),
            CandidateShown(id="refund", shown_as="B", label="환불", description="돈을 돌려받기", answer="5일"),
        ),
    )  # fmt: skip
    embed = CallRecord(
        call_id="call-0002", trace_id=None, created_at=at + timedelta(microseconds=1), role="embed",
        model="minilm", prompt_tokens=9, latency_ms=0.5, energy=0.25,
    )  # fmt: skip
    trace = TraceRecord(
        trace_id="trace-0001", created_at=at, task="support", state='환불은 언제 되나요? "급해요"\n두 번째 줄',
        mode="habit/answer", output="영업일 기준 5일 이내에 환불됩니다.", confidence=0.9, energy=24.75,
        path=({"node": "root", "layer": 1, "chosen": "refund", "p": 0.9, "outcome": "accept",
               "probs": {"A": 0.1, "B": 0.9}, "energy": 24.5, "none_prob": 0.1},),
        recall={"source": "memory", "similarity": 0.75, "threshold": 0.8, "hit": False, "error": None},
    )  # fmt: skip
    store.record_trace(trace, (judge, embed))
    late = at + timedelta(days=1, microseconds=999999)
    fallback = TraceRecord(
        trace_id="trace-0002", created_at=late, task="support", state="It's \"quoted\" — and 'single'", mode="fallback",
        output="Sorry.", energy=310.0, failure="memory: timeout", recall={"source": "memory", "error": "timeout"},
    )  # fmt: skip
    store.record_trace(fallback)
    store.record_trace(replace(fallback, feedback_verdict="wrong", feedback_correction="다시 연락드리겠습니다."))
    config = '{"task":"support","thresholds":{"per_layer":[0.6,0.7],"leaf":0.8},"언어":"한국어"}'
    store.append("run_configs", [{"task": "support", "created_at": at, "config": "{}"}])
    store.append("run_configs", [{"task": "support", "created_at": late, "config": config}])
    big = 2**53 + 1  # not a float: a reader going through doubles would lose the last digit
    store.append("node_stats", [{"scope": "support", "node_id": "root", "hits": big, "accepts": 3, "exits": 1}])
    store.append(
        "node_stats",
        [
            {"scope": "support", "node_id": "root", "hits": 1, "accepts": 1, "exits": 0, "last_used_at": late},
            {"scope": "support", "node_id": "refund", "hits": 2, "accepts": 2, "exits": 0},
        ],
    )
    for accepts in (4, 1):
        store.append(
            "node_choices", [{"scope": "support", "node_id": "root", "chosen_id": "refund", "accepts": accepts}]
        )
    counts = {"reinforced": 5, "penalized": 1, "missed": 0, "explored": 2, "disputed": 1}
    store.append("habit_reliability", [{"scope": "support", "item_id": "refund", **counts}])
    store.append("habit_reliability", [{"scope": "support", "item_id": "shadow-0a1b2c3d4e", **counts}])
    store.append("store_meta", [{"key": "restricted", "value": "0"}, {"key": "schema", "value": "gil-telemetry/1"}])
    store.append("promotion_rounds", [{"task": "support", "at_index": 120}, {"task": "support", "at_index": 240}])
    option = '{"id":"promoted-3f2a9c1d0b","kind":"answer","label":"배송 조회","text":"배송 조회는 \\"내 주문\\"에서"}'
    promotion = {
        "task": "support", "at_index": 240, "anchor": "shipping", "option_id": "promoted-3f2a9c1d0b",
        "option": option, "sources": '["trace-0002","trace-0001"]', "support": 7, "anchor_volume": 31,
        "expected_saving": 62.5, "added_cost": 4.125,
    }  # fmt: skip
    store.append("promotions", [promotion])
    review = {"task": "support", "reviewed_at": late, "kind": "promotion", "item_id": "promoted-3f2a9c1d0b"}
    store.append("reviews", [{**review, "decision": "deferred", "note": None}])
    store.append("reviews", [{**review, "decision": "accepted", "note": '검토 완료 — "좋음"'}])
    database = Path(directory) / "telemetry.sqlite"
    export_sqlite(store, database)
    return root, database
