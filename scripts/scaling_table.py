"""One-GPU against two-GPU wall times of the default sweep, from the committed device calls.

Each folder under results/h200x2-scaling/ is one device call on a two-H200 node: `call.log` (the
output of scripts/h200.sh with its `time` lines), `1gpu-meta.json` and `2gpu-meta.json`.  Prints a
Markdown table; `real` is the shell's wall time of the whole command, start-up and merge included.

    python3 scripts/scaling_table.py [results/h200x2-scaling] > results/h200x2-scaling/README.md
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def real_seconds(log: str) -> dict[str, float]:
    """Step name -> the `real` time printed after it (`=== default`, `=== gpus`)."""
    times, step = {}, None
    for line in log.splitlines():
        if line.startswith("=== "):
            step = line.split()[1]
        elif (m := re.match(r"real\s+(\d+)m([\d.]+)s", line)) and step:
            times[step] = int(m[1]) * 60 + float(m[2])
    return times


def row(folder: Path) -> str:
    one = json.loads((folder / "1gpu-meta.json").read_text())
    two = json.loads((folder / "2gpu-meta.json").read_text())
    real = real_seconds((folder / "call.log").read_text())
    shards = [s["wall_s"] for s in two["shards"]]
    order = "2 GPUs first" if list(real).index("gpus") < list(real).index("default") else "1 GPU first"
    return (f"| {folder.name} | {one['git_commit'][:7]} | {order} | {real['default']:.1f} | {one['wall_s']:.1f} | "
            f"{real['gpus']:.1f} | {two['launch_wall_s']:.1f} | {' / '.join(f'{s:.1f}' for s in shards)} | "
            f"**{real['default'] / real['gpus']:.2f}x** | {one['wall_s'] / max(shards):.2f}x |")


def main(root: str = "results/h200x2-scaling") -> None:
    print("# `swabench run default`: one GPU against `--gpus all` on a two-H200 node\n")
    print("Made by `scripts/scaling_table.py` from each call's `call.log` and metas. *real*: the shell's wall "
          "time of the command; *sweep*: the sweep alone (`wall_s`); *launch*: the `--gpus` launcher from "
          "starting the workers to the merged folder (`launch_wall_s`).\n")
    print("| call | code | order | 1 GPU real (s) | 1 GPU sweep (s) | 2 GPUs real (s) | launch (s) | shard sweeps (s) "
          "| speedup, real | speedup, sweep |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for folder in sorted(p for p in Path(root).iterdir() if (p / "call.log").exists()):
        print(row(folder))


if __name__ == "__main__":
    main(*sys.argv[1:])
