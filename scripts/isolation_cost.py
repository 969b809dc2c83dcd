"""What running the points in a supervised worker costs: each scenario swept with the worker (the default) and
`--in-process`, alternating, ROUNDS times each, from the same JIT cache (built first), and the sweep wall time,
the whole command's time and the setup of each run set side by side.

    python3 scripts/isolation_cost.py OUT [SCENARIO ...] [--rounds N] [--case FILTER ...] [--impl NAME ...]
                                      [--shard I/N]

Writes OUT/isolation-cost.csv (one line a run) and prints the table with each scenario's median ratio; the run
folders stay in OUT (isolation-SCENARIO-HOW-ROUND)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from swabench.run import shards  # noqa: E402

HOW = {"supervised": [], "in-process": ["--in-process"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("scenarios", nargs="*", default=["quick"])
    parser.add_argument("--rounds", type=int, default=2, choices=range(1, 11), metavar="1..10")
    parser.add_argument("--case", action="append", default=[])
    parser.add_argument("--impl", action="append", default=[])
    parser.add_argument("--shard", help="I/N: the same shard of each scenario in both modes (a cheaper sample)")
    args = parser.parse_args(argv)
    if args.shard:
        try:
            if shards.parse_shard(args.shard)[1] > 999_999:
                parser.error(f"--shard {args.shard}: at most 999999 shards")
        except shards.ShardError as e:
            parser.error(str(e))
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"OUT {args.out} is a file: give a folder")
    args.out.mkdir(parents=True, exist_ok=True)
    filters = [x for c in args.case for x in ("--case", c)] + [x for i in args.impl for x in ("--impl", i)]
    shard = ["--shard", args.shard] if args.shard else []
    lines = []
    for scenario in args.scenarios:
        subprocess.run([sys.executable, "-m", "swabench", "warmup", scenario, "--jobs", "16", *filters], check=False,
                       stdout=subprocess.DEVNULL)
        for round_ in range(1, args.rounds + 1):
            for how, flags in HOW.items():
                folder = args.out / f"isolation-{scenario}-{how}-{round_}"
                started = time.perf_counter()
                command = [sys.executable, "-m", "swabench", "run", scenario, "--out", str(folder), *flags, *filters,
                           *shard]
                code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
                command_s = time.perf_counter() - started
                meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
                lines.append({"scenario": scenario, "how": how, "round": round_, "exit": code,
                              "points": meta.get("rows"), "sweep_s": meta.get("wall_s"), "setup_s": meta.get("setup_s"),
                              "command_s": round(command_s, 1), "gpu": meta.get("gpu"),
                              "statuses": json.dumps(meta.get("status_counts", {}), sort_keys=True)})
                print(" ".join(f"{k}={v}" for k, v in lines[-1].items()), flush=True)
    header = list(lines[0])
    (args.out / "isolation-cost.csv").write_text("\n".join([",".join(header)] + [
        ",".join(f'"{line[k]}"' if k == "statuses" else str(line[k]) for k in header) for line in lines]) + "\n")
    for scenario in args.scenarios:
        mine = [line for line in lines if line["scenario"] == scenario and line["sweep_s"]]
        for key in ("sweep_s", "command_s"):
            by = {how: statistics.median(line[key] for line in mine if line["how"] == how)
                  for how in HOW if any(line["how"] == how for line in mine)}
            if len(by) == 2:
                print(f"{scenario} {key}: {by['supervised']:.1f} s supervised, {by['in-process']:.1f} s in process: "
                      f"{100 * (by['supervised'] / by['in-process'] - 1):+.1f}% (medians of {args.rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
