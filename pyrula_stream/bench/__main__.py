"""``python -m pyrula_stream.bench [--turns 5000] [--bootstrap-servers B] [--quick]``.

Prints progress on stderr, then a table, and as the LAST line of stdout one JSON object
(``turns_per_s``, ``floor_turns_per_s``, ``ratio``, ``overhead_p50_ms``, ...). Writes
``<out-dir>/<stamp>.json`` and ``<stamp>.png``; ``--write-docs`` refreshes the results
section of ``docs/BENCHMARKS.md`` from this run; ``--profile`` adds a pyinstrument
profile of one extra framework run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pyrula_stream.bench.harness import kafka
from pyrula_stream.bench.headline import headline
from pyrula_stream.bench.plot import plot
from pyrula_stream.bench.report import (
    docs_plot,
    markdown,
    refresh_docs,
    table,
    write_json,
)
from pyrula_stream.bench.runner import PHASES, BenchConfig, progress, run_all
from pyrula_stream.bench.targets import (
    baseline_from_docs,
    baseline_from_file,
    measured_baseline,
    target_rows,
)
from pyrula_stream.runtime import event_loop


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pyrula_stream.bench", description=__doc__)
    p.add_argument("--turns", type=int, help="turns per throughput run (default 5000)")
    p.add_argument("--rounds", type=int, help="framework/floor rounds, A B A B ... (default 3)")
    p.add_argument("--bootstrap-servers", help="a running cluster (else a local broker)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: proves it runs")
    p.add_argument("--profile", action="store_true", help="pyinstrument one framework run")
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)}",
    )
    p.add_argument("--in-flight", type=int, help="turns in flight (default 2000)")
    p.add_argument("--cpu-turns", type=int, help="one-step turns per cpu run (default 5000)")
    p.add_argument("--cpu-step-turns", type=int, help="20-step turns of the cpu phase (250)")
    p.add_argument(
        "--cpu-rounds", type=int, help="1 process, 2 processes, 20 steps: rounds (default 5)"
    )
    p.add_argument(
        "--long-turn-steps", type=int, help="steps per long-turns run of each length (20000)"
    )
    p.add_argument("--long-turn-rounds", type=int, help="long-turns rounds (default 3)")
    p.add_argument("--telemetry-rounds", type=int, help="off, on, every turn: rounds (default 5)")
    p.add_argument("--soak-turns", type=int, help="turns of the soak (default 200000)")
    p.add_argument("--soak-warmup", type=int, help="warm-up turns before it (default 5000)")
    p.add_argument("--parked-turns", type=int, help="turns parked on a timer (default 50000)")
    p.add_argument(
        "--baseline",
        type=Path,
        help="a bench JSON of the baseline commit (default: the Baseline section of --docs "
        "for this machine's CPU)",
    )
    p.add_argument(
        "--baseline-commit",
        help="an older commit (e.g. b71eb38) whose framework runs in every throughput round "
        "from an unpacked side tree: its figures are measured in this run, like with like",
    )
    p.add_argument("--floor-turns", type=int, help="inputs per floor run (default 30000)")
    p.add_argument("--latency-turns", type=int, help="paired latency turns per side (default 2000)")
    p.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    p.add_argument("--write-docs", action="store_true", help="refresh docs/BENCHMARKS.md")
    p.add_argument("--docs", type=Path, default=Path("docs/BENCHMARKS.md"))
    p.add_argument("--keep-topics", action="store_true", help="do not delete bench topics")
    return p.parse_args(argv)


def config_from(args: argparse.Namespace) -> BenchConfig:
    phases = tuple(x.strip() for x in args.phases.split(",") if x.strip())
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"unknown phases {unknown}; choose from {', '.join(PHASES)}")
    overrides: dict[str, object] = {
        "phases": phases,
        "profile": args.profile,
        "keep_topics": args.keep_topics,
        "out_dir": args.out_dir,
        "baseline_commit": args.baseline_commit,
    }
    for name in (
        "turns",
        "rounds",
        "in_flight",
        "cpu_turns",
        "cpu_step_turns",
        "cpu_rounds",
        "long_turn_steps",
        "long_turn_rounds",
        "telemetry_rounds",
        "soak_turns",
        "soak_warmup",
        "parked_turns",
        "floor_turns",
        "latency_turns",
    ):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.quick:
        return BenchConfig.quick_sizes(**overrides)
    return BenchConfig(**overrides)  # type: ignore[arg-type]


def baseline_for(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any] | None:
    """What this run measured of ``--baseline-commit``, over ``--baseline FILE`` or else
    the docs' Baseline row for this CPU (the typed figures fill in what was not measured;
    None: none of them)."""
    typed: dict[str, Any] | None
    if args.baseline is not None:
        typed = baseline_from_file(args.baseline)
    else:
        typed = baseline_from_docs(args.docs, results["machine"]["cpu"])
    return measured_baseline(results, typed)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_from(args)
    with kafka(args.bootstrap_servers) as (bootstrap, broker):
        progress(f"broker: {broker}")
        results = event_loop.run(run_all(config, bootstrap, broker))
    results["baseline"] = baseline_for(args, results)
    results["targets"] = target_rows(headline(results), results["baseline"])
    stamp = results["stamp"]
    json_path = config.out_dir / f"{stamp}.json"
    png_path = plot(results, config.out_dir / f"{stamp}.png")
    results["plot"] = str(png_path)
    write_json(results, json_path)
    if args.write_docs:
        link = docs_plot(png_path, args.docs)
        refresh_docs(args.docs, markdown(results, link))
        progress(f"refreshed {args.docs}")
    print(table(results))
    print(f"results: {json_path}, plot: {png_path}")
    print(json.dumps(headline(results, json_path)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
