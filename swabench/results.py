"""The results store: one folder per run, written so that an interrupted sweep loses nothing.

    rows.jsonl     every finished point, appended and fsynced as it finishes (the source of truth)
    results.csv    the tidy table: one row per case x implementation x backend (rewritten atomically)
    samples.csv    every timing sample, long format (case_id, impl, backend, kind, index, value_us)
    meta.json      environment, command line, method, scenario name and hash, progress
    scenario.toml  the scenario file exactly as run

``--resume`` reopens a folder, drops a half-written last line, and skips the points already there.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where tables are made: the --gpus launcher starts without it
    import pandas as pd

ROWS, TABLE, SAMPLES, META, SCENARIO = "rows.jsonl", "results.csv", "samples.csv", "meta.json", "scenario.toml"
KEY = ("case_id", "impl", "backend")
STATUSES = ("pass", "fail", "xfail", "xpass", "skip")

# The table's leading columns, in order; any others follow.
COLUMNS = [
    "case_id", "case", "impl", "kind", "library", "backend", "resolved_backend", "wrapper", "status", "reason",
    "must_fail", "mode", "storage", "batch_size", "prefix_len", "seq_len", "qo_len", "accept",
    "total_qo", "total_kv", "window_left", "sliding_window", "page_size", "page_layout",
    "num_qo_heads", "num_kv_heads", "head_dim", "dtype", "seed", "device",
    "rel_l2", "max_abs", "row_rel_l2", "probe_rel_l2", "unwritten_rows",
    "plan_us", "compile_s", "timer", "l2", "graph_calls", "repeats", "median_us", "iqr_us", "noise", "eager_us",
    "pairs", "flops", "min_bytes", "tflops", "tbps", "speedup_vs_mask", "pct_peak_tflops", "pct_peak_tbps",
    "point_s", "workload_s",
]


_UMASK = os.umask(0)
os.umask(_UMASK)


class RunFolderError(RuntimeError):
    pass


def atomic_write(path: Path, data: str) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RunStore:
    def __init__(self, folder: Path):
        self.folder = Path(folder)

    # ------------------------------------------------------------ opening
    @classmethod
    def create(cls, folder, meta: dict, scenario_text: str) -> "RunStore":
        folder = Path(folder)
        if folder.exists() and any(folder.iterdir()):
            raise RunFolderError(f"{folder} already holds a run; pass --resume to continue it, "
                                 f"or choose another --out (nothing was written)")
        folder.mkdir(parents=True, exist_ok=True)
        store = cls(folder)
        atomic_write(folder / SCENARIO, scenario_text)
        store.write_meta({**meta, "scenario_sha256": text_hash(scenario_text), "state": "running"})
        (folder / ROWS).touch()
        return store

    @classmethod
    def resume(cls, folder, scenario_text: str) -> "RunStore":
        store = cls(folder)
        if not (store.folder / META).exists() or not (store.folder / ROWS).exists():
            raise RunFolderError(f"{folder} is not a swabench run folder (no {META} / {ROWS}); nothing to resume")
        meta = store.meta()
        if meta.get("scenario_sha256") != text_hash(scenario_text):
            raise RunFolderError(f"{folder} was run with a different scenario file; "
                                 f"resume it with the same file, or start a new --out")
        store._drop_partial_line()
        return store

    def _drop_partial_line(self) -> None:
        path = self.folder / ROWS
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    # ------------------------------------------------------------ rows
    def append(self, row: dict) -> None:
        """Record one finished point durably before the sweep moves on."""
        self.extend([row])

    def extend(self, rows: list[dict]) -> None:
        """Record several rows durably with one flush to disk (a merge writes hundreds at once)."""
        with open(self.folder / ROWS, "a") as f:
            f.write("".join(json.dumps(row, default=_json_default) + "\n" for row in rows))
            f.flush()
            os.fsync(f.fileno())

    def rows(self) -> list[dict]:
        """Every complete row, one per key (the last one wins)."""
        out = {}
        path = self.folder / ROWS
        lines = path.read_text().split("\n") if path.exists() else []
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by an interruption
                continue
            out[tuple(row[k] for k in KEY)] = row
        return list(out.values())

    def done(self) -> set[tuple]:
        return {tuple(r[k] for k in KEY) for r in self.rows()}

    # ------------------------------------------------------------ metadata and tables
    def meta(self) -> dict:
        return json.loads((self.folder / META).read_text())

    def write_meta(self, meta: dict) -> None:
        atomic_write(self.folder / META, json.dumps(meta, indent=2, sort_keys=True, default=_json_default) + "\n")

    def finalize(self, **meta_updates) -> pd.DataFrame:
        """Write results.csv and samples.csv from rows.jsonl (atomically) and update meta.json."""
        rows = self.rows()
        table = add_derived(to_table(rows), self.meta().get("peaks"))
        atomic_write(self.folder / TABLE, table.to_csv(index=False))
        atomic_write(self.folder / SAMPLES, to_samples(rows).to_csv(index=False))
        counts = table["status"].value_counts().to_dict() if len(table) else {}
        self.write_meta({**self.meta(), **meta_updates, "rows": len(table), "status_counts": counts})
        return table


def to_table(rows: list[dict]) -> pd.DataFrame:
    import pandas as pd
    flat = [{k: v for k, v in r.items() if k != "samples"} for r in rows]
    df = pd.DataFrame(flat)
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    lead = [c for c in COLUMNS if c in df.columns]
    return df[lead + [c for c in df.columns if c not in lead]]


def baseline_impl(library: str, storage: str) -> str:
    """The naive custom-mask path a speedup is measured against."""
    return "torch-mask" if library == "torch" else f"{storage}-mask"


def add_derived(table: pd.DataFrame, peaks: dict | None = None) -> pd.DataFrame:
    """Columns that need other rows or the node's peaks: speedup over the naive custom-mask
    baseline of the same case (same backend, else fa2: fa3 has no masks), and percent of the
    measured bf16 matmul rate and copy bandwidth."""
    if table.empty or not {"median_us", "library", "storage"} <= set(table.columns):
        return table
    timed = table.dropna(subset=["median_us"])
    medians = {(r.case_id, r.impl, r.backend): r.median_us for r in timed.itertuples()}

    def speedup(r):
        base = baseline_impl(r.library, r.storage)
        ref = medians.get((r.case_id, base, r.backend), medians.get((r.case_id, base, "fa2")))
        return ref / r.median_us if ref and r.median_us == r.median_us else float("nan")

    table = table.copy()
    table["speedup_vs_mask"] = [speedup(r) for r in table.itertuples()]
    if peaks:
        table["pct_peak_tflops"] = 100 * table["tflops"] / peaks["bf16_matmul_tflops"]
        table["pct_peak_tbps"] = 100 * table["tbps"] / peaks["copy_tbps"]
    return table


WINDOW_PATH = {"paged": "paged-window", "ragged": "ragged-window"}  # fa2, planned with window_left


def versus_fa2_window(table: pd.DataFrame, mask_paths: bool = True) -> pd.DataFrame:
    """Every other timed correct path against fa2's window path on the same case (paged-window on a
    paged case, ragged-window on a ragged one): one row per point with ``ratio`` = its time / fa2's.
    ``mask_paths=False`` leaves out FlashInfer's custom-mask paths (the headline's subject)."""
    if table.empty or "median_us" not in table:
        return table.iloc[0:0].assign(ratio=[])
    t = table[(table["kind"] == "correct") & (table["status"] == "pass") & table["median_us"].notna()]
    if not mask_paths:
        t = t[~((t["library"] == "flashinfer") & t["impl"].str.endswith("-mask"))]
    is_base = (t["backend"] == "fa2") & (t["impl"] == t["storage"].map(WINDOW_PATH))
    base = t[is_base].set_index("case_id")["median_us"].rename("fa2_window_us")
    others = t[~is_base].join(base, on="case_id", how="inner")
    return others.assign(ratio=others["median_us"] / others["fa2_window_us"])


def to_samples(rows: list[dict]) -> pd.DataFrame:
    import pandas as pd
    records = [(r["case_id"], r["impl"], r["backend"], kind, i, v)
               for r in rows for kind, values in (r.get("samples") or {}).items() for i, v in enumerate(values)]
    return pd.DataFrame(records, columns=[*KEY, "kind", "index", "value_us"])


def read_rows(folder) -> list[dict]:
    """A run's rows with their samples: from the journal, or rebuilt from results.csv and samples.csv
    (published folders do not carry the journal)."""
    import pandas as pd
    store = RunStore(folder)
    if (store.folder / ROWS).exists():
        return store.rows()
    table = pd.read_csv(store.folder / TABLE)
    samples = pd.read_csv(store.folder / SAMPLES)
    grouped = {key: {kind: g["value_us"].tolist() for kind, g in rows.groupby("kind")}
               for key, rows in samples.groupby(list(KEY))}
    rows = []
    for row in table.to_dict("records"):
        row = {k: v for k, v in row.items() if not (isinstance(v, float) and v != v)}
        row["samples"] = grouped.get(tuple(row[k] for k in KEY), {})
        rows.append(row)
    return rows


def load(folder) -> tuple[pd.DataFrame, dict]:
    """A run's table and metadata (rebuilt from rows.jsonl when the run never finished)."""
    import pandas as pd
    meta = load_meta(folder)
    store = RunStore(folder)
    if (store.folder / ROWS).exists():
        return add_derived(to_table(store.rows()), meta.get("peaks")), meta
    return pd.read_csv(store.folder / TABLE), meta


def load_meta(folder) -> dict:
    """A run's metadata alone."""
    if not (Path(folder) / META).exists():
        raise RunFolderError(f"{folder} is not a swabench run folder (no {META})")
    return RunStore(folder).meta()


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)
