"""Hold a profile folder's nsys times against a run of the same points made without the profiler
(what `swabench profile --against RUN` records at profiling time), for a profile made before that
option: writes PROFILE/nsys_vs_unprofiled.csv and prints the worst agreement at 40 us and more.
Usage: python scripts/profile_against.py PROFILE_FOLDER RUN_FOLDER"""

import sys
from pathlib import Path

import pandas as pd

from swabench.run import profiling
from swabench.store import run_folder

profile, run = Path(sys.argv[1]), Path(sys.argv[2])
stats = profiling.hold_against(pd.read_csv(profile / "nsys_stats.csv"), run_folder.load(run)[0])
run_folder.atomic_write(profile / "nsys_vs_unprofiled.csv", stats.to_csv(index=False))
long = stats[stats["graph_unprofiled_us"] >= 40]
print(f"{len(long)} points of 40 us or more: graph (unprofiled) against nsys within "
      f"{long['agreement_unprofiled'].abs().max():.2%}; the profiled run's own graph times within "
      f"{long['agreement'].abs().max():.2%}")
