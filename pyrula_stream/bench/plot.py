"""One PNG of a run: throughput against the floor, latency overhead, in-flight throughput,
journal growth and restore speed (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyrula_stream.bench.stats import percentile


def plot(results: dict[str, Any], path: Path) -> Path:
    """Draw whichever phases ran into ``path`` and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    ax_tp, ax_lat, ax_conc, ax_jr, ax_rs, ax_txt = axes.flat
    _throughput(ax_tp, results.get("throughput"))
    _latency(ax_lat, results.get("latency"))
    _concurrency(ax_conc, results.get("concurrency"))
    _journal(ax_jr, results.get("journal"))
    _restore(ax_rs, results.get("restore"))
    m = results["machine"]
    ax_txt.axis("off")
    ax_txt.text(
        0.0,
        0.95,
        f"pyrula-stream bench\n{results['date']}\n\n"
        f"{m['logical_cores']} cores, {m['memory_gb']} GB\n{m['cpu']}\n\n"
        f"broker: {results['broker']}\n\n{results['command']}",
        va="top",
        fontsize=9,
        wrap=True,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _empty(ax: Any, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)


def _throughput(ax: Any, tp: dict[str, Any] | None) -> None:
    title = "Throughput: framework vs floor (turns/s)"
    if not tp:
        return _empty(ax, title)
    fw = [r["turns_per_s"] for r in tp["framework_runs"]]
    fl = [r["turns_per_s"] for r in tp["floor_runs"]]
    many = [r["turns_per_s"] for r in tp.get("all_cores_runs", [])]
    xs = range(len(fw))
    bars = [
        ax.bar([x - 0.27 for x in xs], fw, width=0.27, label="framework, 1 process"),
        ax.bar(list(xs), fl, width=0.27, label="floor (raw confluent-kafka)"),
    ]
    if many:
        label = f"framework, {tp['all_cores_processes']} processes (auto)"
        bars.append(ax.bar([x + 0.27 for x in xs][: len(many)], many, width=0.27, label=label))
    for bar in bars:
        ax.bar_label(bar, fmt="%.0f", fontsize=8)
    ax.set_xticks(list(xs), [f"round {x + 1}" for x in xs])
    ax.set_yscale("log")
    ax.set_ylim(top=max(fw + fl + many) * 5)  # room for the legend above the bars
    all_cores = f", all cores {tp['ratio_all_cores']:.3f}" if many else ""
    ax.set_title(f"{title}\nratio of medians {tp['ratio']:.3f}{all_cores}")
    ax.legend(fontsize=8)


def _latency(ax: Any, lat: dict[str, Any] | None) -> None:
    title = "Overhead per turn (turn time - model time)"
    if not lat:
        return _empty(ax, title)
    for key, label in (
        ("overheads_ms", "submit to run:complete read back"),
        ("in_worker_ms", "run:start to run:complete (worker ts)"),
    ):
        values = sorted(lat[key])
        if values:
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.plot(values, ys, label=label)
    o = lat["overheads_ms"]
    for q in (50, 99):
        ax.axvline(percentile(o, q), linestyle=":", color="grey")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of turns")
    ax.set_title(
        f"{title}\n{lat['model_latency_ms']:.0f} ms model x 2; "
        f"p50 {lat['overhead_p50_ms']:.0f} ms, p99 {lat['overhead_p99_ms']:.0f} ms"
    )
    ax.legend(fontsize=8, loc="lower right")


def _concurrency(ax: Any, conc: dict[str, Any] | None) -> None:
    title = "Turns in flight: achieved vs ideal (turns/s)"
    if not conc:
        return _empty(ax, title)
    bars = ax.bar(
        ["achieved", "ideal"],
        [conc["turns_per_s"], conc["ideal_turns_per_s"]],
        color=["tab:blue", "tab:grey"],
    )
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_title(
        f"{title}\n{conc['in_flight']} in flight, {conc['model_latency_s']:g} s model; "
        f"{conc['rss_kb_per_inflight_turn']:.1f} KB RSS per turn"
    )


def _journal(ax: Any, jr: dict[str, Any] | None) -> None:
    title = "Journal bytes per turn by steps"
    if not jr:
        return _empty(ax, title)
    steps = [s["steps"] for s in jr["sizes"]]
    ax.plot(steps, [s["bytes_per_turn"] for s in jr["sizes"]], "o-", label="written")
    ax.plot(
        steps, [s["live_bytes_per_turn"] for s in jr["sizes"]], "s--", label="live after completion"
    )
    ax.set_xlabel("steps per turn")
    ax.set_ylabel("bytes")
    ax.set_title(
        f"{title}\n{jr['journal_bytes_per_step']:.0f} bytes per step, R² {jr['linear_r2']:.4f}"
    )
    ax.legend(fontsize=8)


def _restore(ax: Any, rs: list[dict[str, Any]] | None) -> None:
    title = "Restore speed (records/s)"
    if not rs:
        return _empty(ax, title)
    bars = ax.bar([f"{r['live_entries']:,}" for r in rs], [r["records_per_s"] for r in rs])
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.axhline(100_000, linestyle=":", color="grey", label="target 100k/s")
    ax.set_xlabel("live journal entries")
    ax.set_title(title)
    ax.legend(fontsize=8)
