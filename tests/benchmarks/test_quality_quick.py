"""The quality benchmark (benchmarks/quality.py) end to end at its quick size on the real local models: every
table and plot is produced. No speed or accuracy target is asserted here: those are the benchmark's findings."""

from __future__ import annotations

import json

import pytest

from benchmarks._quality_markdown import SECTION, replace_section
from benchmarks.quality import QUICK, QualityResults, run


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> QualityResults:
    return run(quick=True, out_dir=tmp_path_factory.mktemp("quality"))


@pytest.mark.slow
@pytest.mark.local_model
def test_every_stream_runs_every_arm_on_the_quick_sizes(results: QualityResults) -> None:
    assert [stream.name for stream in results.streams] == list(QUICK.streams)
    for stream in results.streams:
        assert stream.skipped is None
        assert [arm.key for arm in stream.arms] == ["full", "tree", "reflex", "memory"]
        sizes = [arm.requests for arm in stream.arms]
        assert sizes == [QUICK.requests] * 3 + [QUICK.events], stream.name
        for arm in stream.arms:
            assert arm.energy > 0 and arm.llm_calls + arm.embed_calls > 0, (stream.name, arm.key)
            assert arm.accuracy.n == arm.requests
        assert stream.arm("full") is not None and stream.arm("full").llm_calls >= 1  # type: ignore[union-attr]
        assert stream.arm("reflex").embed_calls > 0  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.local_model
def test_energy_is_fitted_from_the_runs_own_calls(results: QualityResults) -> None:
    assert results.prices.chat is not None and results.prices.chat_samples > 0
    assert results.prices.embed_samples > 0


@pytest.mark.slow
@pytest.mark.local_model
def test_a_plot_per_stream_and_the_section_with_a_table_and_targets_per_stream(results: QualityResults) -> None:
    for stream in results.streams:
        assert stream.plot is not None and stream.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (results.out_dir / "quality.md").read_text(encoding="utf-8")
    assert markdown == results.markdown and markdown.startswith(f"## {SECTION}\n")
    for stream in results.streams:
        assert f"### {stream.title}" in markdown
        assert f"(plots/quality-{stream.name}.png)" in markdown
    assert markdown.count("| arm | requests | accuracy [95% CI] |") == len(results.streams)
    assert markdown.count("| energy (2)/(1) ≤ 0.5 |") == len(results.streams)
    assert markdown.count("| (4) memory precision ≥ 99% after warm-up |") == len(results.streams)
    saved = json.loads((results.out_dir / "quality.json").read_text(encoding="utf-8"))
    assert [stream["stream"] for stream in saved["streams"]] == list(QUICK.streams)


def test_replacing_the_section_keeps_every_other_section() -> None:
    before = "# Benchmarks\n\n## Speed\n\nfast\n\n## Quality and cost (part A)\n\nold\n\n## Memory\n\nfalse hits\n"
    replaced = replace_section(before, f"## {SECTION}\n\nnew\n")
    assert (
        replaced
        == "# Benchmarks\n\n## Speed\n\nfast\n\n## Quality and cost (part A)\n\nnew\n\n## Memory\n\nfalse hits\n"
    )
    appended = replace_section("# Benchmarks\n\n## Speed\n\nfast\n", f"## {SECTION}\n\nnew\n")
    assert appended == "# Benchmarks\n\n## Speed\n\nfast\n\n## Quality and cost (part A)\n\nnew\n"
