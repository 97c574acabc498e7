"""Memory's similarity cut read from the log with the learned judge on (``gil_core.learned.memory_cut``): on a log
built so that each request's nearest earlier confirmed request sits at a chosen cosine and agrees or not, the
cut is raised, proven lower, kept, or turned off; and through the real resolver a hit the log no longer
supports is a miss."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gil_core.learned import MemoryCut, fit_memory_cut
from gil_core.learned.log import Confirmed, LearnedLog, VerdictDigest
from gil_core.llm import OpenAICompatibleChatModel
from tests.learned._support import bad_model, learned_task, resolver_with_memory, support_stream, train


def pairs_log(groups: list[tuple[float, int, int]]) -> LearnedLog:
    """Per group (cosine, agreeing, disagreeing): that many pairs of confirmed requests, the second of each at
    that cosine to the first and orthogonal to every other request, with the same answer or another (the first
    of a pair is orthogonal to every earlier request, and its answer is no earlier one's)."""
    count = sum(right + wrong for _, right, wrong in groups)
    dimensions = 2 * count
    vectors, options = [], []
    pair = 0
    for cosine, right, wrong in groups:
        for agrees in [True] * right + [False] * wrong:
            first = np.zeros(dimensions, dtype=np.float32)
            first[2 * pair] = 1.0
            second = np.zeros(dimensions, dtype=np.float32)
            second[2 * pair], second[2 * pair + 1] = cosine, np.sqrt(1.0 - cosine * cosine)
            vectors += [first, second]
            options += [f"a{pair}", f"a{pair}" if agrees else f"b{pair}"]  # a pair's first agrees with no other
            pair += 1
    confirmed = tuple(Confirmed(f"t{i}", i, option) for i, option in enumerate(options))
    return LearnedLog(confirmed, np.vstack(vectors), (), VerdictDigest(len(options), 0))


def cut_of(log: LearnedLog, *, configured: float = 0.9, window: int = 10_000) -> MemoryCut:
    return fit_memory_cut(log, configured=configured, precision=0.97, min_support=20, window=window)


def test_learned_memory_cut_is_raised_where_the_configured_one_is_significantly_short() -> None:
    found = cut_of(pairs_log([(0.92, 80, 20), (0.97, 100, 0)]))
    assert found.rule == "raised" and found.cut == pytest.approx(0.97, abs=1e-6)
    assert (found.support, found.right) == (100, 100)
    assert found.serves(0.975) and not found.serves(0.95)


def test_learned_memory_cut_is_lowered_only_where_the_log_proves_it() -> None:
    proven = cut_of(pairs_log([(0.85, 200, 0)]))
    assert proven.rule == "proven" and proven.cut == pytest.approx(0.85, abs=1e-6)
    few = cut_of(pairs_log([(0.85, 60, 0)]))  # 60/60: its lower bound (0.94) does not reach 0.97
    assert few.rule == "configured" and few.cut == 0.9


def test_learned_memory_cut_stays_as_configured_when_the_log_does_not_show_it_short() -> None:
    kept = cut_of(pairs_log([(0.92, 28, 2)]))  # 93%, but its upper bound (0.98) holds the target
    assert kept.rule == "configured" and kept.cut == 0.9 and (kept.support, kept.right) == (30, 28)


def test_learned_memory_cut_is_off_when_no_cut_reaches_the_precision() -> None:
    off = cut_of(pairs_log([(0.92, 80, 20), (0.99, 24, 6)]))
    assert off.rule == "off" and off.cut is None and not off.serves(1.0)


def test_learned_memory_cut_reads_precision_only_from_verdicts_the_queue_did_not_choose() -> None:
    log = pairs_log([(0.92, 80, 20), (0.97, 100, 0)])
    wrong_ones = {f"t{2 * pair + 1}" for pair in range(80, 100)}  # the second of each disagreeing pair
    queued = tuple(replace(item, chosen_by="queue") if item.trace_id in wrong_ones else item for item in log.confirmed)
    found = cut_of(replace(log, confirmed=queued))
    assert found.rule == "configured" and (found.support, found.right) == (180, 180)


def test_learned_memory_cut_reads_only_the_latest_window() -> None:
    log = pairs_log([(0.92, 0, 100), (0.97, 100, 0)])  # the wrong pairs came first
    assert cut_of(log).rule == "raised"
    assert cut_of(log, window=200).rule == "configured"  # the latest 200 requests: 100 agreeing pairs


async def test_learned_memory_cut_turns_a_hit_the_log_does_not_support_into_a_miss(tmp_path: Path) -> None:
    """Memory configured far too loose (0.3): after 120 confirmed requests the log shows it significantly short
    of the task's precision (0.95), the fit raises the cut, and a request whose nearest entry lies between the
    two is not served from memory."""
    task = learned_task(memory_threshold=0.3, audit_rate=0.0)
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver, _ = resolver_with_memory(chat, tmp_path)
            await train(resolver, task, 120, chunk=40)
            state = await resolver.learner.serving_state(task)  # type: ignore[union-attr]
            assert state.memory is not None and state.memory.rule == "raised"
            cut = state.memory.cut
            assert cut is not None and cut > 0.3 and state.memory.right >= 0.95 * state.memory.support
            held_out = [example.text for example in support_stream()[120:200]]
            between = []
            for text in held_out:
                resolution = await resolver.resolve(task, text)
                recall = resolution.recall
                assert recall is not None and recall.similarity is not None
                if 0.3 <= recall.similarity < cut:
                    between.append(resolution)
    assert between, "no held-out request fell between the configured and the learned cut"
    for resolution in between:
        assert resolution.recall is not None and not resolution.recall.hit
        assert resolution.recall.threshold == cut and resolution.mode != "memory"


def test_learned_memory_cut_off_keeps_the_configured_threshold(tmp_path: Path) -> None:
    from gil_core.learned import memory_configured
    from gil_core.taskfile import TaskFileError, parse_task_file

    on, off = learned_task(memory_threshold=0.9), learned_task(memory_threshold=0.9, memory_cut=False)
    assert memory_configured(on) == 0.9 and memory_configured(off) is None
    text = "task: t\ntree: {tree}\nthresholds: {{per_layer: [0.6], leaf: 0.7}}\nlearned_reflex: {learned}\n"
    tree = tmp_path / "tree.yaml"
    tree.write_text("id: root\noptions:\n- {id: a, label: a, text: A.}\n- {id: b, label: b, text: B.}\n")
    parsed = parse_task_file(
        text.format(tree=tree, learned="{precision: 0.9, memory_cut: false}"), path=tmp_path / "t.yaml"
    )
    assert parsed.task.policy.learned is not None and parsed.task.policy.learned.memory_cut is False
    with pytest.raises(TaskFileError, match="memory_cut must be true or false"):
        parse_task_file(text.format(tree=tree, learned="{precision: 0.9, memory_cut: 1}"), path=tmp_path / "t.yaml")
