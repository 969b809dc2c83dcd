"""Which declared paths have run on a GPU: every implementation x storage x step (mode) the registry declares, and
the newest run folder where that path came through the gate on a GPU, or why no case can run it, or that it never
has.  A correct path counts where it passed; a known bug or planted mistake where it was gated as predicted (pass
where its mistake cannot show, xfail where it was caught).  A fail, an xpass or a skip is no run, and neither is a
row made on the CPU."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from swabench.core.cases import MODES
from swabench.errors import UserError
from swabench.impls import registry

COUNTS = {"correct": ("pass",), "known-bug": ("pass", "xfail"), "planted": ("pass", "xfail")}  # statuses that say a
# path of that kind ran and came through the gate
NEVER = "never run on a GPU"
# The small shape a path is tried on (and the coverage scenario runs): a window of 128 keys inside 512 cached ones
SHAPE = dict(batch_size=2, prefix_len=512, sliding_window=128, num_qo_heads=8, num_kv_heads=2, head_dim=128,
             dtype="bfloat16", page_size=16)
STEP = {"extend": dict(extend_len=64), "verify": dict(draft_tokens=4),
        "draft_extend": dict(draft_tokens=4, accept="uniform"), "decode": {}, "mixed": dict(extend_len=64, prefills=1)}
FEATURE = {"sinks": dict(sinks=True), "chunk": dict(attention_chunk=256, sliding_window=None),
           "tree": dict(tree="chain"), "block": dict(block=2), "soft_cap": dict(logits_soft_cap=30.0),
           "fp8_kv": dict(kv_dtype="float8_e4m3fn")}  # each Case.features name: the axes that switch it on
# The other shapes tried before a path is said to run no case: what the paths' own checks look at
TRIED = dict(head_dim=(128, 64, 256), page_size=(16, 1, 64), dtype=("bfloat16", "float16"))


@dataclass(frozen=True)
class Ran:
    """One run as coverage reads it: its folder, its table (a row per point) and its meta.json."""
    folder: str
    table: pd.DataFrame
    meta: dict


@dataclass(frozen=True)
class Declared:
    """One declared path and what the runs say of it."""
    impl: str
    library: str
    kind: str
    storage: str
    mode: str
    run: str | None = None  # the folder's name where it last came through the gate on a GPU
    card: str | None = None  # that run's GPU, from its meta.json
    cannot: str | None = None  # why no case can run it: its own check refuses every shape tried

    @property
    def where(self) -> str:
        """Where it last ran on a GPU, in words."""
        if self.run:
            return f"`{self.run}` ({self.card})"
        return f"cannot run: {self.cannot}" if self.cannot else NEVER

    @property
    def gap(self) -> bool:
        """Declared, runnable, and never run on a GPU."""
        return not self.run and not self.cannot


def declared_paths(impls) -> list[tuple]:
    """(implementation, storage, step) for every storage each declares and every step it models (all of them where
    it names none)."""
    return [(impl, storage, mode) for impl in impls for storage in impl.storages for mode in (impl.modes or MODES)]


def point_of(impl, storage: str, mode: str) -> dict:
    """The scenario axes of the small shape that ``impl`` runs on a ``storage`` ``mode`` step: the features it exists
    for switched on."""
    point = {**SHAPE, "mode": mode, "storage": storage, **STEP[mode]}
    for feature in sorted(impl.requires):
        point.update(FEATURE[feature])
    return {k: v for k, v in point.items() if v is not None}


def refusal(impl, storage: str, mode: str) -> str | None:
    """Why no case of this path can run, where its checks refuse the small shape on every backend it has and every
    head_dim, page size and dtype in TRIED (the reason given on the small shape), else None."""
    from swabench.inputs import axes

    first = None
    for values in itertools.product(*TRIED.values()):
        try:
            case = axes.make_case({**point_of(impl, storage, mode), **dict(zip(TRIED, values))})
        except UserError as e:
            first = first or str(e)
            continue
        for backend in impl.runs_on(registry.backends()):
            reason = impl.skip_reason(case, backend, None)
            if reason is None:
                return None
            first = first or reason
    return first


def on_gpu(run: Ran) -> pd.Series:
    """The rows of ``run`` made on a GPU: the row's torch device, else the run's."""
    device = run.table["device"].fillna(run.meta.get("device", "")) if len(run.table) else run.table["device"]
    return device.astype(str).str.startswith("cuda")


def came_through(table: pd.DataFrame) -> pd.Series:
    """The rows where the path came through the gate as its kind predicts (COUNTS); none of a path the registry
    no longer holds."""
    kinds = {impl.name: impl.kind for impl in registry.all_implementations()}
    allowed = table["impl"].map(lambda name: COUNTS.get(kinds.get(name), ()))
    return pd.Series([s in ok for s, ok in zip(table["status"], allowed)], index=table.index, dtype=bool)


def run_folders(paths) -> list[Path]:
    """The run folders ``paths`` name: each a run folder, or a folder of run folders (results/), whose subfolders
    without a meta.json (logs) are passed over; RunFolderError for a path that is neither."""
    from swabench.store import run_folder

    found = []
    for path in map(Path, paths):
        inside = sorted(p for p in path.iterdir() if (p / run_folder.META).is_file()) \
            if path.is_dir() and not (path / run_folder.META).exists() else [path]
        if not inside:
            raise run_folder.RunFolderError(f"{path} is neither a run folder nor a folder of run folders (no "
                                            f"{run_folder.META} in it or in any folder it holds)")
        found += inside
    return found


def load(paths) -> list[Ran]:
    """The runs ``paths`` name (``run_folders``), each read as stored."""
    from swabench.store import run_folder, tables

    folders = run_folders(paths)
    tables.each_once(folders)
    return [Ran(str(folder), *run_folder.load(folder)) for folder in folders]


def last_runs(runs: list[Ran]) -> dict[tuple, tuple[str, str]]:
    """(implementation, storage, step) -> (folder name, card) of the newest run (by meta.json's time_utc, then the
    later given) where the path came through the gate on a GPU; ``runs``: anything with a folder, table and meta."""
    newest: dict[tuple, tuple] = {}
    for order, run in enumerate(runs):
        t = run.table
        ran = t[on_gpu(run) & came_through(t)] if len(t) else t
        when = (str(run.meta.get("time_utc") or ""), order)
        for path in set(zip(ran["impl"], ran["storage"], ran["mode"])):
            if path not in newest or when > newest[path][0]:
                newest[path] = (when, Path(run.folder).name, run.meta.get("gpu") or "a GPU")
    return {path: (folder, card) for path, (_, folder, card) in newest.items()}


def coverage(impls, runs: list[Ran]) -> list[Declared]:
    """Every declared path of ``impls``, with the run where it last came through the gate on a GPU, or why it cannot
    run; in registration order, then storage and step."""
    last = last_runs(runs)
    rows = []
    for impl, storage, mode in declared_paths(impls):
        folder, card = last.get((impl.name, storage, mode), (None, None))
        rows.append(Declared(impl.name, impl.library, impl.kind, storage, mode, folder, card,
                             None if folder else refusal(impl, storage, mode)))
    return rows


def frame(rows: list[Declared]) -> pd.DataFrame:
    """The table as the pages print it, its columns in words."""
    return pd.DataFrame([{"implementation": f"`{r.impl}`", "library": r.library, "storage": r.storage, "step": r.mode,
                          "last came through the gate on a GPU": r.where} for r in rows])


def gaps_by_impl(rows: list[Declared]) -> dict[str, list[str]]:
    """Each implementation with a gap -> its paths never run on a GPU, as 'storage step'."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if r.gap:
            out.setdefault(r.impl, []).append(f"{r.storage} {r.mode}")
    return out


def headline(rows: list[Declared]) -> str:
    """'N of M declared paths have run on a GPU', with the paths no case can run and the gaps counted."""
    ran, cannot = sum(bool(r.run) for r in rows), sum(bool(r.cannot) for r in rows)
    gaps = sum(r.gap for r in rows)
    return (f"{ran} of {len(rows)} declared paths (implementation x storage x step) have run on a GPU"
            + (f"; {cannot} cannot run on any case" if cannot else "")
            + (f"; {gaps} never have" if gaps else "; no gaps"))
