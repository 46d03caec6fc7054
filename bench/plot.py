"""Charts for docs/benchmarks.md from the benchmarks' JSON output (bench/results/*.json).

    python bench/plot.py [--results bench/results] [--out docs/img]

Each chart is drawn only when its JSON exists; returns the list of PNGs written.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bars(ax, labels: list[str], series: dict[str, list[float]], ylabel: str, fmt: str = "{:.1f}"):
    """Grouped bar chart: one group per label, one bar per series, values written on top."""
    n = len(series)
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
        rects = ax.bar(xs, values, width, label=name)
        ax.bar_label(rects, [fmt.format(v) for v in values], fontsize=8, padding=2)
    ax.set_xticks(range(len(labels)), labels, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)


def throughput(d: dict, ax) -> str:
    runs = d["runs"]
    labels = [f"{r['workload'].replace('_', ' ')}\n{r['dtype']}" for r in runs]
    bars(ax, labels, {"agentlang": [r["agentlang"]["tokens_per_s"] for r in runs],
                      "HF generate (batch 8)": [r["hf"]["tokens_per_s"] for r in runs]},
         "output tokens / s")
    top = max(r["agentlang"]["tokens_per_s"] for r in runs)
    for j, r in enumerate(runs):
        ax.text(j, top * 1.12, f"{r['speedup']:.1f}×", ha="center", fontsize=10,
                fontweight="bold")
    ax.set_ylim(0, top * 1.45)
    ax.legend(fontsize=8, loc="upper center", ncols=2)      # above the bars and the ratios
    if runs[0].get("weights") == "auto":
        return f"Engine on the quantized GGUF vs HF {runs[0]['hf_dtype']} (ratio in bold)"
    return "Engine throughput vs HF transformers (ratio in bold)"


def programs(d: dict, ax) -> str:
    runs = d["runs"]
    bars(ax, [r["program"].replace("_", " ") for r in runs],
         {"agentlang (forks/batch + radix cache)": [r["agentlang_s"] for r in runs],
          "naive sequential, no cache": [r["naive_s"] for r in runs]}, "wall time (s)")
    return f"Agent programs ({d['dtype']}): " + ", ".join(f"{r['speedup']:.1f}×" for r in runs)


def kv_memory(d: dict, ax) -> str:
    rs = d["results"]
    labels = [r["policy"] + (f"\npage {r['page_size']}" if r["page_size"] else "") for r in rs]
    bars(ax, labels, {"KV waste %": [r["waste_pct"] for r in rs],
                      "mean concurrent requests": [r["mean_concurrent"] for r in rs]}, "")
    return f"Paged vs contiguous KV: {d['concurrency_ratio']:.1f}× more concurrent requests"


def kv_quant(d: dict, ax) -> str:
    rs = d["results"]
    bars(ax, [r["kv_dtype"] for r in rs],
         {"top-1 agreement %": [100 * r["top1_agreement"] for r in rs],
          "4k-token requests in budget": [r["requests_4k_in_budget"] for r in rs]}, "")
    return "Quantized KV: quality and capacity"


def structured(d: dict, ax) -> str:
    jf = d["jump_forward"]
    v = d["validity"]
    bars(ax, ["forward passes (key-heavy JSON)", "wall time (s)"],
         {"jump-forward off": [jf["off"]["forward_passes"], jf["off"]["wall_s"]],
          "jump-forward on": [jf["on"]["forward_passes"], jf["on"]["wall_s"]]}, "")
    valid = ", ".join(f"{b} {x['valid_pct']:.0f}% valid" for b, x in v.items())
    return (f"Structured output: {jf['passes_saved_pct']:.0f}% fewer passes with jump-forward"
            f"\n20-schema set: {valid}")


def serve(d: dict, ax) -> str:
    a, h = d["in_process"], d["http"]
    bars(ax, ["output tok/s", "TTFT p50 (s)", "TTFT p99 (s)"],
         {"in-process engine": [a["tokens_per_s"], a["ttft_p50_s"], a["ttft_p99_s"]],
          "HTTP, 16 clients": [h["tokens_per_s"], h["ttft_p50_s"], h["ttft_p99_s"]]}, "")
    return "Server overhead: HTTP vs in-process"


def multi_agent(d: dict, ax) -> str:
    """Interactive TTFT p50 / p99 per run (idle server, priorities off, on)."""
    runs = {k: d["runs"][k] for k in ("idle", "off", "on") if k in d["runs"]}
    names = {"idle": "idle server", "off": "busy, priorities off", "on": "busy, priorities on"}
    bars(ax, [names[k] for k in runs], {"TTFT p50 (s)": [r["ttft_p50_s"] for r in runs.values()],
                                        "TTFT p99 (s)": [r["ttft_p99_s"] for r in runs.values()]},
         "interactive time to first token (s)", fmt="{:.2f}")
    ax.set_yscale("log")
    if "idle" in runs:
        target = 2 * runs["idle"]["ttft_p99_s"]
        ax.axhline(target, color="grey", lw=0.8, ls=":")
        ax.text(-0.4, target * 1.08, f"target: p99 ≤ 2× idle = {target:.2f} s", fontsize=8)
    censored = ", ".join(f"{k} {r['censored_turns']}/{r['turns']}" for k, r in runs.items())
    step = d["engine"].get("max_batch_tokens", 2048)
    bg = ""
    if {"off", "on"} <= set(runs) and "background_tokens_per_cpu_s" in runs["on"]:
        off, on = (runs[k]["background_tokens_per_cpu_s"] for k in ("off", "on"))
        bg = f"background tok per server CPU s: off {off:.0f}, on {on:.0f}\n"
    return (f"Interactive agent vs {d['settings']['background']} background requests, "
            f"{step} tokens/step\n{bg}"
            f"(turns without a first token in {d['settings']['turn_timeout']:.0f} s: {censored})")


def kernels(d: dict, ax) -> str:
    """Decode: kernel-only % of the device's copy bandwidth against context, per batch."""
    rows = [r for r in d["decode"] if "pct_of_copy_graph" in r]
    if not rows:
        raise KeyError("decode rows with CUDA-graph timings")
    styles = {name: ls for name, ls in zip(sorted({r["heads"] for r in rows}), ("-", "--"))}
    for (heads, ls) in styles.items():
        for i, batch in enumerate((1, 8, 32, 128)):
            pts = sorted((r["context"], r["pct_of_copy_graph"]) for r in rows
                         if r["heads"] == heads and r["batch"] == batch)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="o", markersize=3,
                    color=f"C{i}", label=f"{heads.split(' ')[0]}, batch {batch}")
    ax.axhline(60, color="grey", lw=0.8, ls=":")
    ax.text(rows[0]["context"], 55, "target 60 % (batch ≥ 32, context ≥ 4k)", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context tokens per sequence")
    ax.set_ylabel("% of copy bandwidth")
    ax.legend(fontsize=7, ncol=2)
    ax.spines[["top", "right"]].set_visible(False)
    return f"Paged decode attention, {d['device']} (kernel time, CUDA graph)"


def kernels_extend(d: dict, ax) -> str:
    """Extend: kernel time over SDPA's on the same data (CUDA-graph timings)."""
    rows = d["extend"]
    labels = [f"{r['heads'].split(' ')[0]}\n{r['batch']}×{r['new']}"
              + (f"\n+{r['prefix']} cached" if r["prefix"] else "") for r in rows]
    bars(ax, labels, {"triton / SDPA time": [r["ratio_graph"] for r in rows]}, "time ratio",
         fmt="{:.2f}")
    ax.axhline(1.5, color="grey", lw=0.8, ls=":")
    return f"Paged extend attention vs SDPA, {d['device']} (target ≤ 1.5)"


def cpu_local(d: dict, ax) -> str:
    """Batch-1 decode and prefill-512 tok/s, agentlang vs llama.cpp on the same GGUF."""
    runs = {k.removeprefix("speed_"): v for k, v in d.items() if k.startswith("speed_")}
    labels = [f"{what}\n{act} compute" for act in runs for what in ("decode", "prefill-512")]
    bars(ax, labels, {"agentlang": [r[k] for r in runs.values() for k in ("al_decode", "al_prefill")],
                      "llama.cpp": [r[k] for r in runs.values() for k in ("cpp_decode", "cpp_prefill")]},
         "tokens / s (batch 1)", fmt="{:.0f}")
    ax.legend(fontsize=8)
    return f"Local CPU, {d['model']}, 2 threads: agentlang vs llama.cpp, same file"


# chart name -> (the JSON it reads, its drawing function)
CHARTS: dict[str, tuple[str, Callable[[dict, plt.Axes], str]]] = {
    "throughput": ("throughput", throughput), "throughput_quant": ("throughput_quant", throughput),
    "programs": ("programs", programs),
    "kv_memory": ("kv_memory", kv_memory), "kv_quant": ("kv_quant", kv_quant),
    "structured": ("structured", structured), "serve": ("serve", serve),
    "multi_agent": ("multi_agent", multi_agent), "cpu_local": ("cpu_local_speed", cpu_local),
    "kernels": ("kernels", kernels), "kernels_extend": ("kernels", kernels_extend),
}


def plot_all(results: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (source, draw) in CHARTS.items():
        src = results / f"{source}.json"
        if not src.exists():
            continue
        fig, ax = plt.subplots(figsize=(8, 4.2))
        try:
            title = draw(json.loads(src.read_text()), ax)
        except KeyError as e:
            print(f"skip {name}: {src} lacks {e}")
            plt.close(fig)
            continue
        ax.set_title(title, fontsize=11)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
        print(f"wrote {path}")
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default="bench/results")
    ap.add_argument("--out", default="docs/img")
    args = ap.parse_args()
    plot_all(Path(args.results), Path(args.out))


if __name__ == "__main__":
    main()
