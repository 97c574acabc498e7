"""The quality benchmark (benchmarks/quality.py) end to end at its quick size on the real local models: every
table and plot is produced. No speed or accuracy target is asserted here: those are the benchmark's findings."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from benchmarks._quality_markdown import SECTION, replace_section
from benchmarks._quality_streams import StreamMissingError, headlines_stream, home_stream, repeating_stream
from benchmarks.quality import QUICK, QualityResults, run


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> QualityResults:
    return run(quick=True, out_dir=tmp_path_factory.mktemp("quality"))


@pytest.mark.heavy
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


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.local_model
def test_energy_is_fitted_from_the_runs_own_calls(results: QualityResults) -> None:
    assert results.prices.chat is not None and results.prices.chat_samples > 0
    assert results.prices.embed_samples > 0


@pytest.mark.heavy
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


def test_the_repeating_stream_is_seeded_and_returns_to_its_requests_as_repeats_and_paraphrases() -> None:
    stream = home_stream()
    bases = stream.sample(20)
    events = repeating_stream(stream, bases, 80)
    assert events == repeating_stream(stream, bases, 80)
    by_id = {base.id: base for base in bases}
    seen: set[str] = set()
    for event in events:
        base = by_id[event.id.split("#", 1)[0]]
        assert event.expected == base.expected
        if base.id not in seen:
            assert (event.kind, event.text) == ("original", base.text)
        elif event.kind == "repeat":
            assert event.text == base.text
        else:
            assert event.kind == "paraphrase" and event.text != base.text
        seen.add(base.id)
    kinds = Counter(event.kind for event in events)
    assert kinds["repeat"] > 0 and kinds["paraphrase"] > 0


def test_headlines_are_read_from_the_csv_and_a_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "headlines.csv"
    path.write_text('"Q: gold futures end the week 1.4% higher\nA:",up,6556\n', encoding="utf-8")
    (request,) = headlines_stream(path).requests
    assert (request.id, request.text, request.expected, request.option_id) == (
        "n6556",
        "gold futures end the week 1.4% higher",
        "up",
        "up",
    )
    with pytest.raises(StreamMissingError, match=r"nowhere\.csv"):
        headlines_stream(tmp_path / "nowhere.csv")
