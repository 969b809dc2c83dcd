"""Hold a profile folder's nsys times against a run of the same points made without the profiler
(what `swabench profile --against RUN` records at profiling time), for a profile made before that
option: writes PROFILE/nsys_vs_unprofiled.csv and prints the worst agreement at 40 us and more.
Usage: python scripts/profile_against.py PROFILE_FOLDER RUN_FOLDER"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from swabench.errors import UserError  # noqa: E402
from swabench.run import profiling  # noqa: E402
from swabench.store import paths, run_folder, schema, tables  # noqa: E402

NEEDED = (*schema.KEY, "nsys_period_us", "agreement")  # the columns read of the profile's table


def nsys_stats(profile: Path):
    """The profile folder's nsys_stats.csv, with the columns hold_against reads (a RunFolderError naming it else)."""
    path = tables.stored(profile, schema.KERNELS)
    if not path.exists():
        raise tables.RunFolderError(f"{profile} has no {schema.KERNELS}: not a folder `swabench profile` wrote")
    stats = tables.csv_file(path)
    missing = [c for c in NEEDED if c not in stats.columns]
    if missing:
        raise tables.RunFolderError(f"{path} is not an nsys_stats table: no column {', '.join(missing)}")
    return stats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", type=Path, metavar="PROFILE_FOLDER", help="a folder `swabench profile` wrote")
    parser.add_argument("run", type=Path, metavar="RUN_FOLDER", help="a run of the same points without the profiler")
    args = parser.parse_args(argv)
    out = args.profile / "nsys_vs_unprofiled.csv"
    try:
        paths.file_out(out, "PROFILE_FOLDER's nsys_vs_unprofiled.csv")
        stats = profiling.hold_against(nsys_stats(args.profile), run_folder.load(args.run)[0])
        run_folder.atomic_write(out, stats.to_csv(index=False))
    except UserError as e:
        parser.error(str(e))
    long = stats[stats["graph_unprofiled_us"] >= 40]
    print(f"{len(long)} points of 40 us or more: graph (unprofiled) against nsys within "
          f"{long['agreement_unprofiled'].abs().max():.2%}; the profiled run's own graph times within "
          f"{long['agreement'].abs().max():.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
