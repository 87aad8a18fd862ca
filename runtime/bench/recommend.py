"""--recommend: the draft length per batch size that maximised aggregate throughput, as a draft_len_schedule.

Semantics (TensorRT-LLM's, `tensorrt_llm/_torch/speculative/utils.py: get_draft_len_for_batch_size`, and our
EngineConfig.draft_len_for): keys are batch-size thresholds, the first key >= the batch size applies.
TensorRT-LLM's validator also wants the smallest key's value to equal max_draft_len (older releases: key 1
present and equal to max_draft_len) and every value <= max_draft_len; the schedule built here meets both:
the draft length chosen at the smallest swept concurrency becomes max_draft_len, larger concurrencies choose
among draft lengths <= it, and key 1 is always present. Autoregressive counts as draft length 0.

Past the largest key the two runtimes differ: TensorRT-LLM turns speculation off (0), our runtime keeps the last
value. The schedule is only measured up to the largest swept concurrency.
"""
from __future__ import annotations

METRIC = "aggregate_tokens_per_s"


def point_draft_len(p: dict) -> int:
    return 0 if p["mode"] == "ar" else int(p["draft_len"])


def compress(schedule: dict[int, int]) -> dict[int, int]:
    """Merge runs of equal draft lengths into their largest key (same meaning under first-key->=-batch rule)."""
    items = sorted(schedule.items())
    out = {}
    for i, (k, v) in enumerate(items):
        if i + 1 < len(items) and items[i + 1][1] == v:
            continue
        out[k] = v
    return out


def recommend(points: list[dict], metric: str = METRIC) -> dict:
    """points: sweep summaries with mode, draft_len, concurrency and `metric`. Returns the recommendation."""
    by_c: dict[int, list[dict]] = {}
    for p in points:  # adaptive points have no single draft length to put in a schedule
        if p.get(metric) is not None and p.get("draft_len_policy") != "adaptive":
            by_c.setdefault(int(p["concurrency"]), []).append(p)
    if not by_c:
        raise ValueError("no measured points to recommend from")
    conc = sorted(by_c)

    def best(c, cap=None):
        cands = [p for p in by_c[c] if cap is None or point_draft_len(p) <= cap]
        if not cands:  # nothing within the cap measured here: recorded as 0 (no speculation)
            return None
        # ties: the shorter draft length (cheaper, no worse)
        return max(cands, key=lambda p: (p[metric], -point_draft_len(p)))

    raw = {c: point_draft_len(best(c)) for c in conc}
    cap = raw[conc[0]]
    chosen, constrained, best_points = {}, [], {}
    for c in conc:
        b = best(c, cap)
        chosen[c] = point_draft_len(b) if b is not None else 0
        if b is None or chosen[c] != raw[c]:
            constrained.append(c)
        best_points[c] = {"mode": b["mode"] if b else None, "draft_len": chosen[c], metric: b[metric] if b else None}
    schedule = compress(chosen)
    if 1 not in schedule:
        schedule[1] = schedule[min(schedule)]
        schedule = dict(sorted(schedule.items()))
    notes = [f"first key >= batch size applies; beyond batch size {conc[-1]} (the largest swept) TensorRT-LLM "
             "disables speculation while dflash_trt keeps the last value"]
    if constrained:
        notes.append(f"at concurrency {', '.join(map(str, constrained))} the unconstrained best draft length was "
                     f"larger than max_draft_len {cap} (the choice at the smallest concurrency): chose the best "
                     "within it, as TensorRT-LLM requires every value <= max_draft_len")
    if cap == 0:
        notes.append("autoregressive was fastest at the smallest concurrency: max_draft_len 0 means no "
                     "speculation; deploy without speculative_config")
    return {"metric": metric, "draft_len_schedule": schedule, "max_draft_len": cap,
            "best_by_concurrency": best_points, "unconstrained_best": raw, "notes": notes}


def schedule_json(schedule: dict[int, int]) -> dict[str, int]:
    """The mapping as JSON (string keys): LLM(draft_len_schedule=json.load(f)) and TensorRT-LLM's YAML (JSON is
    YAML; pydantic's dict[int, int] coerces the keys) both take it."""
    return {str(k): int(v) for k, v in sorted(schedule.items())}


def trtllm_yaml(rec: dict, drafter: str | None = None) -> str:
    """A speculative_config fragment for trtllm-serve/trtllm-bench --config."""
    sched = ", ".join(f"{k}: {v}" for k, v in sorted(rec["draft_len_schedule"].items()))
    if rec["max_draft_len"] == 0:
        return ("# dflash-bench --recommend: autoregressive decoding was fastest at the smallest swept batch size;\n"
                "# TensorRT-LLM needs max_draft_len >= 1 for DFlash: serve without speculative_config.\n"
                f"# measured schedule (dflash_trt accepts it): draft_len_schedule: {{{sched}}}\n")
    lines = ["# dflash-bench --recommend: draft length per batch size (first key >= batch size applies;",
             "# TensorRT-LLM disables speculation past the largest key)", "speculative_config:",
             "  decoding_type: DFlash", f"  speculative_model: {drafter or '/path/to/drafter'}",
             f"  max_draft_len: {rec['max_draft_len']}", f"  draft_len_schedule: {{{sched}}}"]
    return "\n".join(lines) + "\n"
