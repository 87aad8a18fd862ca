"""The sweep's outputs: a versioned JSON report, a text table (rich) and a Pareto plot (matplotlib).

Report schema (schema "dflash-bench", schema_version 1), top-level keys:
  schema, schema_version, created, dflash_trt_version, complete (false while the sweep is still running),
  config {dataset, num_requests, max_tokens, temperature, concurrency, modes, draft_lens, seed, ignore_eos,
          chat, threads, device, dtype, num_devices},
  model {target, draft, engine_dir, embedded, drafter_trained},
  dataset {name, source, num_prompts, rejected_placeholders, cycled, notes, prompt_tokens {mean, min, max}},
  definitions {metric: text},
  points [{mode, draft_len, label, concurrency, <metrics.summarize keys>, iterations, mean_batch_size,
           mean_iteration_s, elapsed_s, requests [per-request records]}],
  recommendation (null, or recommend.recommend's dict), files {name: path}.
"""
from __future__ import annotations

import datetime
import io
import json
import os

SCHEMA = "dflash-bench"
SCHEMA_VERSION = 1

_TOP = {"schema": str, "schema_version": int, "created": str, "dflash_trt_version": str, "complete": bool,
        "config": dict, "model": dict, "dataset": dict, "definitions": dict, "points": list,
        "recommendation": (dict, type(None)), "files": dict}
_CONFIG = ("dataset", "num_requests", "max_tokens", "temperature", "concurrency", "modes", "draft_lens", "seed",
           "ignore_eos", "chat", "threads", "device", "dtype", "num_devices")
_POINT = {"mode": str, "draft_len": int, "label": str, "concurrency": int, "num_requests": int,
          "output_tokens": int, "wall_s": float, "aggregate_tokens_per_s": float,
          "aggregate_tokens_per_s_per_device": float, "tokens_per_s_per_user": (float, type(None)),
          "e2e_tokens_per_s_per_user": float, "ttft_s": dict, "tpot_s": dict, "latency_s": dict,
          "tau": (float, type(None)), "acceptance_rate": (float, type(None)), "acceptance_by_position": list,
          "accept_length_hist": list, "requests": list}
_REQUEST = ("index", "task_id", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "latency_s", "steps",
            "drafted", "accepted", "tau", "draft_lens", "accept_lens", "finish_reason")


def build_report(config: dict, model: dict, dataset: dict, points: list[dict], recommendation: dict | None,
                 files: dict, complete: bool, definitions: dict) -> dict:
    from .. import __version__

    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "dflash_trt_version": __version__, "complete": complete, "config": config, "model": model,
            "dataset": dataset, "definitions": definitions, "points": points, "recommendation": recommendation,
            "files": files}


def _check(obj: dict, spec, where: str) -> list[str]:
    errs = []
    for k in spec:
        if k not in obj:
            errs.append(f"{where}: missing {k}")
        elif isinstance(spec, dict):
            want = spec[k]
            want = want if isinstance(want, tuple) else (want,)
            if float in want:
                want = want + (int,)
            if not isinstance(obj[k], want) or (isinstance(obj[k], bool) and bool not in want):
                errs.append(f"{where}.{k}: {type(obj[k]).__name__} is not {'/'.join(t.__name__ for t in want)}")
    return errs


def validate_report(rep: dict) -> list[str]:
    """Schema errors (empty list: valid)."""
    errs = _check(rep, _TOP, "report")
    if errs:
        return errs
    if rep["schema"] != SCHEMA or rep["schema_version"] != SCHEMA_VERSION:
        errs.append(f"report: schema {rep['schema']} v{rep['schema_version']}, expected {SCHEMA} v{SCHEMA_VERSION}")
    errs += _check(rep["config"], _CONFIG, "config")
    for i, p in enumerate(rep["points"]):
        errs += _check(p, _POINT, f"points[{i}]")
        for j, r in enumerate(p.get("requests", [])):
            errs += _check(r, _REQUEST, f"points[{i}].requests[{j}]")
    rec = rep["recommendation"]
    if rec is not None:
        errs += _check(rec, {"draft_len_schedule": dict, "max_draft_len": int, "best_by_concurrency": dict,
                             "notes": list}, "recommendation")
    return errs


def write_json(path: str, obj) -> None:
    """Atomic write (a reader never sees half a report)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _f(v, fmt="{:.1f}", scale=1.0):
    return "-" if v is None else fmt.format(v * scale)


def make_table(points: list[dict], title: str | None = None):
    from rich.table import Table

    t = Table(title=title)
    for col in ("mode", "K", "conc", "agg tok/s", "tok/s/user", "TTFT ms p50/p90", "TPOT ms p50/p90", "tau",
                "accept", "accept@1..4"):
        t.add_column(col, justify="left" if col in ("mode", "accept@1..4") else "right", no_wrap=True)
    for p in points:
        pos = " ".join(f"{a:.2f}" for a in p["acceptance_by_position"][:4]) or "-"
        ms = lambda d: f"{_f(d['p50'], scale=1e3)}/{_f(d['p90'], scale=1e3)}"  # noqa: E731
        k = str(p["draft_len"]) if p.get("draft_len_policy") != "adaptive" else f"<={p['draft_len']}"
        t.add_row({"ar": "AR", "ngram": "n-gram"}.get(p["mode"], "DFlash"), k, str(p["concurrency"]),
                  _f(p["aggregate_tokens_per_s"]), _f(p["tokens_per_s_per_user"]), ms(p["ttft_s"]), ms(p["tpot_s"]),
                  _f(p["tau"], "{:.2f}"), _f(p["acceptance_rate"], "{:.2f}"), pos)
    return t


def table_text(points: list[dict], title: str | None = None, width: int = 160) -> str:
    from rich.console import Console

    con = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    con.print(make_table(points, title))
    return con.export_text()


def plot_pareto(points: list[dict], path: str, title: str = "", per_device: bool = True) -> None:
    """x: tokens/s per user, y: aggregate tokens/s (per device); one curve per mode/draft length, points
    labelled with their concurrency (the interactivity-throughput trade-off figure)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    ykey = "aggregate_tokens_per_s_per_device" if per_device else "aggregate_tokens_per_s"
    series: dict[tuple, list[dict]] = {}
    for p in points:
        if p.get("tokens_per_s_per_user") is not None and p.get(ykey) is not None:
            series.setdefault((p["mode"] != "ar", p["draft_len"], p.get("draft_len_policy") or ""), []).append(p)
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    markers = "osD^v<>ph*"
    for n, ((_, k, _), ps) in enumerate(sorted(series.items())):
        ps = sorted(ps, key=lambda p: p["concurrency"])
        xs = [p["tokens_per_s_per_user"] for p in ps]
        ys = [p[ykey] for p in ps]
        label = ps[0]["label"]
        ax.plot(xs, ys, marker=markers[n % len(markers)], linestyle="--" if k == 0 else "-", label=label)
        for p, x, y in zip(ps, xs, ys):
            ax.annotate(f"c={p['concurrency']}", (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("tokens/s per user (mean 1/TPOT)")
    ax.set_ylabel("aggregate output tokens/s per device" if per_device else "aggregate output tokens/s")
    ax.set_title(title or "DFlash vs autoregressive: throughput vs interactivity")
    ax.grid(True, alpha=0.3)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    if series:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
