"""How the soak (benchmarks/soak.py) reads its processes' samples: where the growth's span starts and ends, which
samples the RSS growth is read from, and when a process is left out of the verdict."""

from __future__ import annotations

import math
from typing import Any

from benchmarks._soak_worker import python_allocator_bytes, warm_read_plans
from benchmarks.soak import UNSPANNED_COMPACTION, UNSPANNED_RESOLVING, _memory_failures, compacted_by, growth, span

MIB = 2**20


def _round(index: int, *, rss: float, settled: float, file: float, accounted: float) -> dict[str, Any]:
    """A sample as a soak worker prints it after round ``index`` (MiB)."""
    return {
        "round": index, "resolved": 100, "round_s": 10.0, "at": 1010.0 + 10 * index,
        "rss": rss * MIB, "rss_anon": (rss - file) * MIB, "rss_file": file * MIB,
        "settled": {"rss": settled * MIB, "rss_anon": (settled - file) * MIB, "rss_file": file * MIB,
                    "settle_s": 2.0},
        "accounted": {"request cache": accounted * MIB, "other reachable from the runtime": 7 * MIB},
        "malloc": None, "malloc_free": None, "fds": 20, "threads": 28,
    }  # fmt: skip


def _run(rss: list[float], settled: list[float], file: list[float], accounted: list[float]) -> list[dict[str, Any]]:
    rows = zip(rss, settled, file, accounted, strict=True)
    return [_round(i, rss=r, settled=s, file=f, accounted=a) for i, (r, s, f, a) in enumerate(rows)]


def _flat(rounds: int, file: list[float] | None = None) -> list[dict[str, Any]]:
    return _run([300] * rounds, [300] * rounds, file or [150] * rounds, [1] * rounds)


def test_the_warm_up_ends_after_its_rounds_and_the_growth_is_read_to_the_last_round() -> None:
    assert span(_flat(6)) == (1, 5)
    assert span(_flat(2)) == UNSPANNED_RESOLVING  # no round after the warm-up's


def test_a_first_round_of_its_own_ends_the_warm_up_and_for_a_verdict_giver_one_at_the_end_ends_the_span() -> None:
    late = [{**line, "resolved": 0 if line["round"] < 3 else 100} for line in _flat(6)]
    assert span(late) == (3, 5)  # the pair's second process, which first found rounds done
    giver = [{**line, "resolved": 0 if line["round"] < 5 else 100, "verdicts": 20} for line in _flat(6)]
    assert span(giver) == (1, 4)  # the pair's verdict giver, which resolved only its last round
    only_giving = [{**line, "resolved": 0, "verdicts": 20} for line in _flat(6)]
    assert span(only_giving) == (1, 5)  # giving verdicts is its steady state
    waiting = [{**line, "resolved": 0 if line["round"] < 5 else 100} for line in _flat(6)]
    assert span(waiting) == UNSPANNED_RESOLVING  # found every round done but its last, gave no verdicts
    read = growth(waiting)
    assert not read["spanned"] and read["unspanned"] == UNSPANNED_RESOLVING


def test_the_growth_is_read_from_the_settled_samples_and_the_old_reading_is_kept_beside_it() -> None:
    # Round-end RSS includes pages the allocator was about to give back; the settled one does not.
    samples = _run(
        rss=[280, 300, 308, 311, 314, 317],
        settled=[278, 295, 300, 301, 302, 303],
        file=[140, 148, 150, 150.5, 150.5, 150.5],
        accounted=[1, 2, 3, 4, 5, 6],
    )
    read = growth(samples)
    assert (read["warm_up"], read["until"]) == (2, 6) and read["spanned"] and read["unspanned"] is None
    assert read["rss_growth"] == 8 * MIB  # settled: 303 - 295
    assert read["file_growth"] == 2.5 * MIB and read["anon_growth"] == 5.5 * MIB
    assert read["round_end_growth"] == 17 * MIB  # at the rounds' ends: 317 - 300
    assert read["accounted_growth"] == 4 * MIB  # 'other' is not counted


def test_live_allocations_are_malloc_s_bytes_in_use_and_python_s_small_objects_when_both_were_sampled() -> None:
    samples = _flat(6)
    for index, line in enumerate(samples):
        line["malloc"], line["malloc_free"] = (100 + 2 * index) * MIB, 10 * MIB
        line["python_allocator"] = {"arenas": (40 + index) * MIB, "in_use": (30 + 0.5 * index) * MIB}
    read = growth(samples)  # from round 2 (index 1) to round 6 (index 5)
    assert (read["malloc_growth"], read["python_allocator_growth"], read["live_growth"]) == (8 * MIB, 2 * MIB, 10 * MIB)
    del samples[1]["python_allocator"]  # a sample from before the soak read Python's allocator
    assert growth(samples)["python_allocator_growth"] is None and growth(samples)["live_growth"] is None


def test_python_s_allocator_is_read_from_this_interpreter_and_sees_small_objects_come_and_go() -> None:
    before = python_allocator_bytes()
    held = [(f"row {index}",) for index in range(100_000)]  # ~100 bytes each, all small objects
    during = python_allocator_bytes()
    del held
    after = python_allocator_bytes()
    assert before["arenas"] >= before["in_use"] > 0
    assert during["in_use"] - before["in_use"] >= 100_000 * 80
    assert during["in_use"] - after["in_use"] >= 100_000 * 80


def test_the_compactor_s_failed_memory_compactions_are_counted_and_each_reason_told_once() -> None:
    passes = [
        {"memory_merged": {"a": 12, "b": "memory at /s/b: Commit conflict for version 40"}},
        {"memory_merged": {"a": "memory at /s/a: Commit conflict for version 41", "b": 3}},
        {"memory_merged": {"a": 0, "b": "memory at /s/b: Commit conflict for version 40"}},
    ]
    told = _memory_failures(passes)
    assert told.startswith("3 memory compactions failed (tried again at the next pass): ")
    assert told.count("version 40") == 1 and "version 41" in told
    none = _memory_failures([{"memory_merged": {"a": 1}}])
    assert none == "0 memory compactions failed (tried again at the next pass)"
    one = _memory_failures([{"memory_merged": {"a": "x"}}])
    assert one == "1 memory compaction failed (tried again at the next pass): x"


def test_the_compactor_s_first_merge_and_prune_of_a_store_is_the_later_of_the_two_passes() -> None:
    passes = [
        {"merged": {"a": 0, "b": 4}, "memory_versions_removed": {"a": 0, "b": 0}, "ended_at": 100.0},
        {"merged": {"a": 7, "b": 3}, "memory_versions_removed": {"a": 0, "b": 2}, "ended_at": 120.0},
        {"merged": {"a": 2, "b": 1}, "memory_versions_removed": {"a": 5, "b": 1}, "ended_at": 140.0},
    ]
    assert compacted_by(passes, "a") == 140.0  # merged at 120, pruned at 140
    assert compacted_by(passes, "b") == 120.0  # merged at 100, pruned at 120
    assert compacted_by(passes, "c") == math.inf  # never met
    assert compacted_by(passes[:2], "a") == math.inf  # merged, never pruned


def test_the_warm_up_lasts_until_a_round_begun_after_the_compactor_met_the_store() -> None:
    samples = _flat(8)  # round i begins at 1000 + 10 i
    assert span(samples, compacted_at=995.0) == (1, 7)  # met before the first round: the rounds' warm-up alone
    assert span(samples, compacted_at=1031.0) == (4, 7)  # round 4 (index) is the first begun after it
    assert span(samples, compacted_at=1030.0) == (3, 7)  # a round begun at that very moment counts
    assert span(samples, compacted_at=1061.0) == UNSPANNED_COMPACTION  # only the last round began after it
    assert span(samples, compacted_at=math.inf) == UNSPANNED_COMPACTION
    late = [{**line, "resolved": 0 if line["round"] < 7 else 100} for line in samples]
    assert span(late, compacted_at=math.inf) == UNSPANNED_RESOLVING  # not resolving before its last round is first
    read = growth(samples, compacted_at=1031.0)
    assert (read["warm_up"], read["until"]) == (5, 8)
    assert read["rss_growth_two_rounds"] == 0  # and the reading with the rounds' warm-up alone is kept beside it


def test_the_soak_s_warm_up_reads_a_folder_in_each_plan_the_store_takes() -> None:
    # The anti-join after a compacted file, the sort for a folder out of write order, plain files: the first read
    # of each pages in library code once per process, which the soak's warm-up takes out of its growth.
    assert warm_read_plans() == [True, False, True]
