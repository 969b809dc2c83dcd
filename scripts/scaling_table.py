"""One-GPU against two-GPU wall times of the default sweep, from the committed device calls.

Each folder under results/h200x2-scaling/ (in git history since aaeb9df: `git archive aaeb9df^
results/h200x2-scaling | tar x` brings it back) is one device call on a two-H200 node: `call.log` (the
output of scripts/h200.sh with its `time` lines), `1gpu-meta.json` and `2gpu-meta.json`.  Prints a
Markdown table; `real` is the shell's wall time of the whole command, start-up and merge included.

    python3 scripts/scaling_table.py [results/h200x2-scaling] > results/h200x2-scaling/README.md
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from swabench.errors import UserError  # noqa: E402
from swabench.store import reading  # noqa: E402


def real_seconds(log: str) -> dict[str, float]:
    """Step name -> the `real` time printed after it (`=== default`, `=== gpus`)."""
    times, step = {}, None
    for line in log.splitlines():
        if line.startswith("=== "):
            step = line.split()[1]
        elif (m := re.match(r"real\s+(\d+)m([\d.]+)s", line)) and step:
            times[step] = int(m[1]) * 60 + float(m[2])
    return times


def rows(folder: Path) -> list[str]:
    """One row per `--gpus` run of the call (`gpus`, and `gpus-again` when it ran), and one more
    against the one-GPU run at half the CPU threads (`default-half`) when it ran."""
    real = real_seconds(reading.read_text(folder / "call.log", reading.LOG, errors="replace"))
    pairs = [("default", step, "") for step in ("gpus", "gpus-again")]
    pairs.append(("default-half", "gpus", ", 1 GPU at half the threads"))
    out = []
    for base, step, note in pairs:
        one_file = folder / ("1gpu-half-meta.json" if base == "default-half" else "1gpu-meta.json")
        two_file = folder / f"2{step.replace('gpus', 'gpu')}-meta.json"
        if base not in real or step not in real or not one_file.exists() or not two_file.exists():
            continue
        one, two = read_meta(one_file, ("wall_s",)), read_meta(two_file, ("launch_wall_s",))
        shards = [s["wall_s"] for s in two["shards"]]
        order = "2 GPUs first" if list(real).index(step) < list(real).index(base) else "1 GPU first"
        start = f"{two['total_s'] - two['launch_wall_s']:.1f}" if "total_s" in two else "-"
        label = folder.name + (" (again)" if step != "gpus" else "") + (f" ({note[2:]})" if note else "")
        out.append(f"| {label} | {one['git_commit'][:7]} | {order} | "
                   f"{real[base]:.1f} | {one['wall_s']:.1f} | {real[step]:.1f} | {start} | "
                   f"{two['launch_wall_s']:.1f} | {' / '.join(f'{s:.1f}' for s in shards)} | "
                   f"**{real[base] / real[step]:.2f}x** | {one['wall_s'] / max(shards):.2f}x |")
    return out


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_meta(path: Path, numbers: tuple[str, ...]) -> dict:
    """A call's meta.json holding what rows() reads of it (its git_commit, ``numbers``, a two-GPU run's shards'
    wall_s and, where recorded, total_s): a ReadError naming the file otherwise."""
    meta = reading.json_file(path, reading.META)
    shards = meta.get("shards") if isinstance(meta, dict) else None
    fine = isinstance(meta, dict) and isinstance(meta.get("git_commit"), str) and \
        all(is_number(meta.get(k)) for k in numbers) and is_number(meta.get("total_s", 0))
    if fine and "launch_wall_s" in numbers:
        fine = isinstance(shards, list) and bool(shards) and all(isinstance(s, dict) and is_number(s.get("wall_s"))
                                                                  for s in shards)
    if not fine:
        raise reading.ReadError(f"{path}: not the meta.json of such a run (a git_commit, {' and '.join(numbers)} as "
                                f"numbers{', shards with their wall_s' if 'launch_wall_s' in numbers else ''})")
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path("results/h200x2-scaling"),
                        help="a folder of device calls, each with its call.log (default: results/h200x2-scaling)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"ROOT {args.root}: not a folder (bring it back with `git archive aaeb9df^ "
                     f"results/h200x2-scaling | tar x`)")
    try:
        table = [row for folder in sorted(p for p in args.root.iterdir() if (p / "call.log").exists())
                 for row in rows(folder)]
    except UserError as e:
        parser.error(str(e))
    if not table:
        parser.error(f"ROOT {args.root}: no call folder (one holding call.log and its metas) to tabulate")
    print("# `swabench run default`: one GPU against `--gpus all` on a two-H200 node\n")
    print("Made by `scripts/scaling_table.py` from each call's `call.log` and metas. *real*: the shell's wall "
          "time of the command; *sweep*: the sweep alone (`wall_s`); *launcher start*: the `--gpus` launcher "
          "from its start to starting the workers (`total_s - launch_wall_s`, recorded since 2eb2841); *launch*: "
          "from starting the workers to the merged folder (`launch_wall_s`). A row *at half the threads* sets the "
          "one-GPU run's OMP_NUM_THREADS to half the cores, each `--gpus` worker's share, so the two differ in GPUs "
          "alone.\n")
    print("| call | code | order | 1 GPU real (s) | 1 GPU sweep (s) | 2 GPUs real (s) | launcher start (s) | "
          "launch (s) | shard sweeps (s) | speedup, real | speedup, sweep |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
