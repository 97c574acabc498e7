"""The quality benchmark's section of BENCHMARKS.md: tables per stream with the targets beside the figures, and,
for each missed target, the measurement that says where the miss comes from."""

from __future__ import annotations

import re
from typing import Any

from benchmarks._quality_arms import MEMORY_THRESHOLD, REFLEX_THRESHOLD
from benchmarks._quality_report import (
    TARGET_ENERGY_RATIO,
    TARGET_MEMORY_PRECISION,
    TARGET_MEMORY_SHARE,
    WARMUP_SHARE,
    ArmFigures,
    Interval,
)
from benchmarks._quality_results import QualityResults, StreamResult
from benchmarks._quality_streams import PARAPHRASE_SHARE, ZIPF_EXPONENT

SECTION = "Quality and cost (part A)"
_HEADING = f"## {SECTION}"


def replace_section(text: str, section: str) -> str:
    """``text`` with this benchmark's section replaced by ``section`` (appended when it has none yet); every
    other section stays as it is."""
    match = re.search(rf"^{re.escape(_HEADING)}\s*$", text, flags=re.MULTILINE)
    if match is None:
        return text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    following = re.search(r"^## ", text[match.end() :], flags=re.MULTILINE)
    end = match.end() + following.start() if following else len(text)
    rest = text[end:]
    return text[: match.start()] + section.rstrip("\n") + "\n" + ("\n" + rest if rest else "")


def render_section(results: QualityResults, *, plot_base: str, command: str) -> str:
    sizes = results.sizes
    minutes, seconds = divmod(round(results.seconds), 60)
    lines = [
        _HEADING,
        "",
        f"Command: `{command}` · date {results.day} · {minutes} min {seconds:02d} s in all (model start-up included).",
        f"Machine: {results.machine}. Models: SmolLM2-135M-Instruct (Q4_1) on llama.cpp's server on loopback "
        "(`chat_model: local`), all-MiniLM-L6-v2 int8 ONNX in process (`embedding_model: local`).",
        "",
        f"**Sizes.** Per stream, a fixed seeded sample of {sizes.requests} requests runs arms (1)-(3), each arm on "
        f"the same requests. Arm (4) runs {sizes.events} events of a repeating stream over the same {sizes.requests} "
        f"requests: each event picks a request with Zipf weights (1/rank^{ZIPF_EXPONENT:g}); a request's first event "
        f"is the request itself, a later one a verbatim repeat or ({PARAPHRASE_SHARE:.0%} of them) a mechanical "
        "paraphrase (a greeting or closing, a case change, two letters swapped); feedback from the answer key "
        f"follows every event. Warm-up: the first {WARMUP_SHARE:.0%} of the events; arm (4)'s memory share and "
        "precision are read after it.",
        "",
        "**Arms** (the stream's task file, `fallback_scope: path`): (1) `use_tree: false`, every request goes to "
        "full generation under the tree contract; (2) the tree, generation narrowed to the last confirmed "
        f"category; (3) = (2) with `reflex_threshold: {REFLEX_THRESHOLD}`; (4) = (2) with "
        f"`memory_threshold: {MEMORY_THRESHOLD}` and the memory guard. The request cache is off in every arm, so "
        "each pays for what it asks (memory is the cache under test). Accuracy is an exact match with the answer "
        "key, with its 95% Wilson interval. Wall time is `resolve` alone (feedback excluded), on a local server "
        "the benchmark starts for itself.",
        "",
        _energy_line(results),
        "",
    ]
    for stream in results.streams:
        lines += _stream_lines(stream, plot_base)
    return "\n".join(lines).rstrip("\n") + "\n"


def _energy_line(results: QualityResults) -> str:
    prices = results.prices
    if prices.chat is None:
        return (
            f"**Energy**: too few chat calls with server timings ({prices.chat_samples}) to fit coefficients; "
            "energies below are tokens (prompt + output)."
        )
    chat = prices.chat
    text = (
        f"**Energy**, fitted first (`gil fit-energy`, stored in the run's store) over the run's {prices.chat_samples} "
        f"chat calls' server timings: {chat.fixed:.1f} ms per call + {chat.per_fresh_prompt_token:.2f} ms per fresh "
        f"prompt token + {chat.per_cached_token:.2f} ms per cached prompt token + {chat.per_output_token:.2f} ms per "
        "output token"
    )
    if prices.embed is not None:
        embed = prices.embed
        text += (
            f"; the {prices.embed_samples} embedding calls, fitted the same way to their measured latency: "
            f"{embed.fixed:.2f} ms per call + {embed.per_fresh_prompt_token:.3f} ms per token"
        )
    return text + ". Energies below are in these milliseconds of compute, per request."


def _stream_lines(stream: StreamResult, plot_base: str) -> list[str]:
    lines = [f"### {stream.title}", ""]
    if stream.skipped is not None:
        return [*lines, f"Skipped: {stream.skipped}.", ""]
    lines += [
        f"Source: {stream.source}; sample as above, out of {stream.population}. This stream took "
        f"{stream.seconds:.0f} s.",
        "",
        "| arm | requests | accuracy [95% CI] | energy / request | LLM calls / request | embeddings / request "
        "| wall s / request (p50) | memory share | memory precision |",
        "|---|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for arm in stream.arms:
        memory_note = " (after warm-up)" if arm.key == "memory" else ""
        lines.append(
            f"| {arm.title} | {arm.requests} | {arm.accuracy.render()} | {arm.energy:,.0f} | {arm.llm_calls:.2f} "
            f"| {arm.embed_calls:.2f} | {arm.seconds:.2f} ({arm.seconds_p50:.2f}) "
            f"| {_share(arm.memory)}{memory_note} | {arm.memory_precision.render()} |"
        )
    lines += ["", f"![{stream.title}: cost per request per arm]({plot_base}/quality-{stream.name}.png)", ""]
    lines += _target_lines(stream)
    lines += _diagnostic_lines(stream)
    return lines


def _share(interval: Interval) -> str:
    return "—" if not interval.n or not interval.k else f"{100 * (interval.rate or 0):.1f}%"


def _target_lines(stream: StreamResult) -> list[str]:
    full, tree, memory = stream.arm("full"), stream.arm("tree"), stream.arm("memory")
    rows = ["| target | measured | |", "|---|---|---|"]
    causes: list[str] = []
    if full is not None and tree is not None:
        ratio = tree.energy / full.energy if full.energy else float("nan")
        met = ratio <= TARGET_ENERGY_RATIO
        rows.append(f"| energy (2)/(1) ≤ {TARGET_ENERGY_RATIO} | {ratio:.2f} | {_verdict(met)} |")
        if not met:
            causes.append(_energy_cause(full, tree))
        better = (tree.accuracy.rate or 0.0) >= (full.accuracy.rate or 0.0)
        rows.append(
            f"| accuracy (2) ≥ (1) | {_percent(tree.accuracy)} vs {_percent(full.accuracy)} | {_verdict(better)}"
            f"{_overlap(tree.accuracy, full.accuracy)} |"
        )
        if not better:
            causes.append(_accuracy_cause(full, tree))
        for other in (stream.arm("reflex"), memory):
            if other is not None and full.energy:
                rows.append(f"| energy {other.title[:3]}/(1) (no target) | {other.energy / full.energy:.2f} | |")
    if memory is not None:
        share_met = (memory.memory.rate or 0.0) >= TARGET_MEMORY_SHARE
        rows.append(
            f"| (4) memory answers ≥ {TARGET_MEMORY_SHARE:.0%} of requests after warm-up | "
            f"{memory.memory.render()} | {_verdict(share_met)} |"
        )
        if not share_met:
            causes.append(_memory_share_cause(memory))
        precision = memory.memory_precision
        precision_met = precision.n > 0 and (precision.rate or 0.0) >= TARGET_MEMORY_PRECISION
        verdict = _verdict(precision_met) if precision.n else "**not shown** (no memory answers to judge)"
        rows.append(
            f"| (4) memory precision ≥ {TARGET_MEMORY_PRECISION:.0%} after warm-up | {precision.render()} | "
            f"{verdict}{_precision_note(precision)} |"
        )
        if not precision_met:
            causes.append(_memory_precision_cause(memory))
    lines = [*rows, ""]
    if causes:
        lines += ["Measured causes of the misses:", "", *(f"- {cause}" for cause in causes), ""]
    return lines


def _verdict(met: bool) -> str:
    return "met" if met else "**missed**"


def _percent(interval: Interval) -> str:
    return f"{100 * (interval.rate or 0.0):.1f}%"


def _overlap(a: Interval, b: Interval) -> str:
    if a.bounds is None or b.bounds is None:
        return ""
    apart = a.bounds[0] > b.bounds[1] or b.bounds[0] > a.bounds[1]
    return "" if apart else " (intervals overlap: not a significant difference)"


def _precision_note(precision: Interval) -> str:
    if precision.bounds is None or precision.bounds[0] >= TARGET_MEMORY_PRECISION:
        return ""
    return f" (too few hits to show 99%: the interval's low end is {100 * precision.bounds[0]:.1f}%)"


def _energy_cause(full: ArmFigures, tree: ArmFigures) -> str:
    judge = tree.energy_by_role.get("judge", 0.0)
    generation = sum(tree.energy_by_role.get(role, 0.0) for role in ("fallback", "slot_fill"))
    diagnostics = tree.diagnostics
    habits, requests = diagnostics.get("habits", 0), tree.requests
    text = (
        f"energy (2)/(1): (2) spends {judge:,.0f} per request on judgments and {generation:,.0f} on generation "
        f"(slot filling included); it reached an answer habit on {habits}/{requests} requests, so "
        f"{requests - habits}/{requests} paid judgments and then a generation. (1) spends {full.energy:,.0f} on one "
        "generation. "
    )
    if habits < requests / 2:
        return text + "Cause: model quality: the 135M judge is rarely sure enough to reach a habit."
    return text + "Cause: data: generation under this tree's contract costs little next to the judgments."


def _accuracy_cause(full: ArmFigures, tree: ArmFigures) -> str:
    d = tree.diagnostics
    root = ""
    if d.get("root_judged"):
        root = (
            f"the root judgment chose the expected category for {d['root_right']}/{d['root_judged']} requests "
            f"(chance about 1 in {d['root_choices'] + 1}); "
        )
    return (
        f"accuracy (2) < (1): {root}habit answers were right {d.get('habits_correct', 0)}/{d.get('habits', 0)}, "
        f"narrowed or full generations {d.get('generated_correct', 0)}/{d.get('generated', 0)}; (1)'s full "
        f"generations {full.accuracy.k}/{full.accuracy.n}. Cause: model quality (the judge's choices)."
    )


def _memory_share_cause(memory: ArmFigures) -> str:
    d = memory.diagnostics
    kinds = d.get("kinds_after_warmup", {})
    return (
        f"memory share: of {d.get('after_warmup', 0)} requests after warm-up, {kinds.get('original', 0)} were "
        f"first appearances (nothing to recall: data), and memory missed {d.get('missed_paraphrase', 0)} "
        f"paraphrases and {d.get('missed_repeat', 0)} repeats ({d.get('missed_guard', 0)} of the misses refused by "
        f"the guard; the rest below the {MEMORY_THRESHOLD} cosine{_similarities(d)}). Cause: "
        + (
            "data (too few returns to requests already seen)"
            if kinds.get("original", 0) > d.get("missed_paraphrase", 0)
            else f"our code: a static {MEMORY_THRESHOLD} cosine (the demo task's, not selected from the log) "
            "is stricter than these paraphrases"
        )
        + "."
    )


def _similarities(diagnostics: dict[str, Any]) -> str:
    values = diagnostics.get("missed_paraphrase_similarity") or []
    if not values:
        return ""
    return f": the missed paraphrases' nearest entries were at cosine {min(values):.3f} to {max(values):.3f}"


def _memory_precision_cause(memory: ArmFigures) -> str:
    d: dict[str, Any] = memory.diagnostics
    wrong = d.get("wrong_hit_count", 0)
    if not memory.memory_precision.n:
        return "memory precision: memory answered nothing after warm-up, so there is no precision to read."
    examples = "; ".join(
        f"“{hit['request']}” answered {hit['output']!r} (cos {hit['similarity']:.3f}), key {hit['expected']!r}"
        for hit in d.get("wrong_hits", [])[:3]
    )
    if not wrong:
        return (
            "memory precision: every memory answer after warm-up was right, but too few to show 99% with 95% "
            "confidence. Cause: data (sample size)."
        )
    return (
        f"memory precision: {wrong} memory answers were wrong: {examples}. Cause: our code: the threshold lets a "
        "different request that reads alike through."
    )


def _naming(diagnostics: dict[str, Any]) -> str:
    """How many contract violations still named exactly one answer (and the expected one)."""
    named = diagnostics.get("violations_naming_one_answer", 0)
    if not named:
        return ""
    return f" ({named} of them naming one answer, {diagnostics.get('violations_naming_the_expected', 0)} the expected)"


def _diagnostic_lines(stream: StreamResult) -> list[str]:
    rows = []
    for arm in stream.arms:
        d = arm.diagnostics
        if arm.key == "full":
            generated = f"{d.get('generated_correct', 0)}/{d.get('generated', 0)} right, " + (
                f"{d.get('generated_in_answer_set', 0)} in the answer set, {d.get('generated_no_output', 0)} "
                f"broke the contract{_naming(d)}"
            )
            rows.append(f"| {arm.title} | — | — | {generated} | — |")
            continue
        root = (
            f"{d['root_right']}/{d['root_judged']} (1 in {d['root_choices'] + 1} by chance); accepted "
            f"{d['root_accepted']}/{d['root_judged']}"
            if d.get("root_judged")
            else "—"
        )
        habits = f"{d.get('habits_correct', 0)}/{d.get('habits', 0)} right"
        generated = (
            f"{d.get('generated_correct', 0)}/{d.get('generated', 0)} right, {d.get('generated_no_output', 0)} broke "
            f"the contract{_naming(d)}"
            if d.get("generated")
            else "none"
        )
        reflex = (
            f"{d['reflex_steps']}/{d['steps']} steps; its root choice right {d['reflex_root_right']}/{d['reflex_root']}"
            if "reflex_steps" in d
            else "—"
        )
        rows.append(f"| {arm.title} | {root} | {habits} | {generated} | {reflex} |")
    modes = "; ".join(
        f"{arm.key}: " + ", ".join(f"{mode} {count}" for mode, count in arm.modes.items()) for arm in stream.arms
    )
    errors = {arm.key: arm.diagnostics.get("model_errors", 0) for arm in stream.arms}
    warning = (
        [f"**Warning**: model calls failed (server error or timeout) on {errors} requests; those count as wrong.", ""]
        if any(errors.values())
        else []
    )
    return [
        *warning,
        "| arm | root judgment: chose the expected category; confident enough to descend | habit answers "
        "| generated answers | decided by the reflex |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Modes: {modes}.",
        "",
    ]
