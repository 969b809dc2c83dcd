"""Columns that need other rows of the table or the node's peaks: each point's speedup over its
library's baseline, its share of the GPU's ceiling, its roofline floor and how close it comes to it,
and its read amplification where Nsight Compute counted it.  Written into results.csv when a run
finalizes; added on read for a folder that only has its journal."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from swabench.measure.ceiling import ceilings
from swabench.store import run_folder

if TYPE_CHECKING:
    import pandas as pd


def _default_backend(impl_name: str) -> str:
    """The backend a baseline is timed on when the point's own backend has none (fa3 has no masks)."""
    from swabench.impls import registry

    impl = registry.get(impl_name)
    return impl.backends[0] if impl.backends else impl.library


def span(sliding_window, attention_chunk) -> str:
    """The keys a query may see, as the tables print them: '1024' (a window of 1024 keys), 'chunk 8192',
    or 'none' (a global layer's every key)."""
    if attention_chunk and attention_chunk == attention_chunk:
        return f"chunk {int(attention_chunk)}"
    return str(int(sliding_window)) if sliding_window == sliding_window and sliding_window >= 0 else "none"


def span_order(value: str) -> tuple:
    """Sort key of a span: windows by size, then chunks by size, then none."""
    if value.isdigit():
        return (0, int(value))
    return (1, int(value.split()[1])) if value.startswith("chunk") else (2, 0)


def add_derived(table: pd.DataFrame, peaks: dict | None = None) -> pd.DataFrame:
    """Columns that need other rows or the node's peaks: speedup over the baseline path declared
    for the point's library and storage (same backend, else the baseline's first: fa3 has no masks),
    and the columns of ``per_row``."""
    if table.empty:
        return table
    from swabench.impls import registry

    timed = table.dropna(subset=["median_us"])
    medians = {(r.case_id, r.impl, r.backend): r.median_us for r in timed.itertuples()}
    baselines = {key: registry.baseline_for(*key) for key in set(zip(table["library"], table["storage"]))}

    def speedup(r):
        base = baselines.get((r.library, r.storage))
        if base is None or r.median_us != r.median_us:
            return float("nan")
        ref = medians.get((r.case_id, base, r.backend), medians.get((r.case_id, base, _default_backend(base))))
        return ref / r.median_us if ref else float("nan")

    table = table.copy()
    table["speedup_vs_mask"] = [speedup(r) for r in table.itertuples()]
    return per_row(table, peaks)


def floor_parts(table: pd.DataFrame, peaks: dict) -> tuple[pd.Series, pd.Series]:
    """The two times no kernel beats, in microseconds: ``min_bytes`` (read plus written) at the GPU's DRAM
    ceiling, and the useful flops at its bf16 tensor-core ceiling (``measure.ceiling.ceilings``: the part's peak at its maximum clocks,
    else the measured copy and matmul, as ``peaks['ceiling']`` says)."""
    tbps, tflops = ceilings(peaks)
    memory = table["min_bytes"].astype(float) / (tbps * 1e12) * 1e6
    compute = table["flops"].astype(float) / (tflops * 1e12) * 1e6
    return memory, compute


def memory_bound(table: pd.DataFrame, peaks: dict) -> pd.Series:
    """Per row, whether the bytes' time is the larger part of its floor (``floor_parts``)."""
    memory, compute = floor_parts(table, peaks)
    return memory >= compute


def per_row(table: pd.DataFrame, peaks: dict | None = None) -> pd.DataFrame:
    """The columns each row has from its own numbers and the node's peaks: percent of each ceiling, the
    floor (the larger of ``floor_parts``) and how close the point comes to it (``pct_of_floor`` = 100 x
    floor / median: 100 runs at the ceiling, which no kernel reaches), and, for a point Nsight Compute
    counted, its DRAM bytes read over the bytes its window needs (``read_amplification``).  A point timed on
    a warm L2 has no floor: its bytes need not come from DRAM."""
    if table.empty:
        return table
    if peaks:
        tbps, tflops = ceilings(peaks)
        table = table.assign(pct_peak_tflops=100 * table["tflops"] / tflops, pct_peak_tbps=100 * table["tbps"] / tbps)
    if peaks and {"min_bytes", "flops"} <= set(table.columns):
        memory, compute = floor_parts(table, peaks)
        floor = memory.where(memory >= compute, compute)
        table = table.assign(floor_us=floor.where(table["l2"] != "warm") if "l2" in table else floor)
        table["pct_of_floor"] = 100 * table["floor_us"] / table["median_us"]
    if "dram_read_bytes" in table and "min_read_bytes" in table:
        table = table.assign(read_amplification=table["dram_read_bytes"].astype(float) / table["min_read_bytes"])
    return table


def with_span(table: pd.DataFrame) -> pd.DataFrame:
    """The table with ``span`` (the keys a query may see, as pages print them; not stored)."""
    chunks = table["attention_chunk"].fillna(0) if "attention_chunk" in table else [0] * len(table)
    return table.assign(span=[span(w, c) for w, c in zip(table["sliding_window"], chunks)])


def load(run_dir) -> tuple[pd.DataFrame, dict]:
    """A run's table with its derived columns, and its metadata (store.run_folder.load); a table written
    before a column existed gets what its own rows and peaks give (the floor of a format-6 folder)."""
    table, meta = run_folder.load(run_dir, derive=add_derived)
    if not (Path(run_dir) / run_folder.ROWS).exists():  # read from its table, which may predate these columns
        table = per_row(table, meta.get("peaks"))
    return table, meta
