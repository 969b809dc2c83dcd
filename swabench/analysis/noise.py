"""Which timed points are too noisy to trust: the spread of their samples (IQR / median, the ``noise`` column) above
the suite's noise bar.  A median, and any ratio made of it, means little there; a CPU shared with other work makes
most of its points so, and the report and the command line say it rather than let the numbers pass for times."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

NOISE = 0.02  # the noise bar (IQR / median) a timed point is held to
LONG_US = 20  # points this long or longer are held to the noise bar: under it, jitter alone is a few percent


def held(table: pd.DataFrame) -> pd.DataFrame:
    """The timed points held to the noise bar: those of ``LONG_US`` or more."""
    import pandas as pd

    if not len(table) or "median_us" not in table:
        return table.iloc[0:0]
    return table[pd.to_numeric(table["median_us"], errors="coerce") >= LONG_US]


def noisy(table: pd.DataFrame) -> pd.DataFrame:
    """The held points whose noise is above the bar, the noisiest first."""
    import pandas as pd

    points = held(table)
    if not len(points):
        return points
    points = points.assign(noise=pd.to_numeric(points["noise"], errors="coerce"))
    return points[points["noise"] > NOISE].sort_values("noise", ascending=False)


def mostly_noisy(table: pd.DataFrame) -> bool:
    """Whether more than half of the held points are noisy: the run's times as a whole are not to be trusted."""
    return 2 * len(noisy(table)) > len(held(table)) > 0


def warning(table: pd.DataFrame) -> str | None:
    """What to tell a user whose run is mostly noise, or None: how many points, what it means, what to do."""
    if not mostly_noisy(table):
        return None
    cpu = "device" in table and not table["device"].astype(str).str.startswith("cuda").any()
    why = ("most often another process competing for this CPU's cores: time again on an idle machine, or on a GPU"
           if cpu else "most often a GPU shared with other work, or clocks that moved: time again on an idle GPU")
    timed = int(table["median_us"].notna().sum())
    counted = len(held(table))
    of = f"{counted} timed points" + (f" of {LONG_US} us or more" if counted < timed else "")
    return (f"{len(noisy(table))} of {of} are noisy (IQR / median above {NOISE:.0%}): their times, and the speedups "
            f"made of them, are not to be trusted; {why}")
