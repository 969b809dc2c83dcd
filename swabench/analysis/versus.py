"""Paths held against each other on the same cases: the headline paths, every path against the
reference path of its storage, and each serving feature against its plain twin."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def reference_library() -> str | None:
    """The library the reference paths belong to (FlashInfer): its baselines are the headline's."""
    from swabench.impls import registry

    paths = [registry.reference_path(s) for s in ("paged", "ragged")]
    return next((registry.get(impl).library for impl, _ in filter(None, paths)), None)


def headline_paths(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the headline: the reference library's correct paths other than its baselines, on
    the reference backend (fa2's window and trim paths)."""
    from swabench.impls import registry

    ref = registry.reference_path("paged") or registry.reference_path("ragged")
    if ref is None:
        return table.iloc[0:0]
    baselines = {i.name for i in registry.all_implementations() if i.baseline}
    keep = (table["library"] == registry.get(ref[0]).library) & (table["backend"] == ref[1]) \
        & (table["kind"] == "correct") & ~table["impl"].isin(baselines)
    return table[keep]


def against_reference(table: pd.DataFrame, baselines: bool = True) -> pd.DataFrame:
    """Every other timed correct path against the reference path declared for its storage (fa2's
    window path) on the same case: one row per point with ``ratio`` = its time / the reference's.
    ``baselines=False`` leaves out the reference library's own baselines (the headline's subject)."""
    from swabench.impls import registry

    t = table[(table["kind"] == "correct") & (table["status"] == "pass") & table["median_us"].notna()]
    if t.empty:
        return t.assign(ratio=[])
    refs = {s: registry.reference_path(s) for s in set(t["storage"])}
    ref_impl = t["storage"].map(lambda s: (refs[s] or (None, None))[0])
    ref_backend = t["storage"].map(lambda s: (refs[s] or (None, None))[1])
    if not baselines:
        library = reference_library()
        dropped = {i.name for i in registry.all_implementations() if i.baseline and i.library == library}
        keep = ~t["impl"].isin(dropped)
        t, ref_impl, ref_backend = t[keep], ref_impl[keep], ref_backend[keep]
    is_ref = (t["impl"] == ref_impl) & (t["backend"] == ref_backend)
    ref = t[is_ref].set_index("case_id")["median_us"].rename("reference_us")
    others = t[~is_ref].join(ref, on="case_id", how="inner")
    return others.assign(ratio=others["median_us"] / others["reference_us"])


FEATURES = {"sinks": "sinks", "soft_cap": "logits_soft_cap", "fp8_kv": "kv_dtype"}  # Case.features -> column


def _feature_on(table: pd.DataFrame, column: str) -> pd.Series:
    if column == "kv_dtype":
        return table["kv_dtype"].fillna(table["dtype"]) != table["dtype"]
    return table[column].fillna(0).astype(float) != 0


def plain(table: pd.DataFrame, chunked: bool = False) -> pd.DataFrame:
    """The rows whose case asks for none of the serving features, keeps every page it has, holds random data in
    every slot (a cache fill repeats the shape once a fill) and verifies no draft tree (figures and tables that mix
    shapes compare these); a chunked layer's rows only with ``chunked``."""
    keep = ~sum((_feature_on(table, column) for column in FEATURES.values()), start=table["impl"].isna())
    if "page_layout" in table:
        keep &= ~table["page_layout"].astype(str).str.startswith("evicted")
    if "cache_fill" in table:
        keep &= table["cache_fill"].fillna("random") == "random"
    if "tree" in table:
        keep &= table["tree"].isna()
    if "attention_chunk" in table and not chunked:
        keep &= table["attention_chunk"].fillna(0) == 0
    return table[keep.astype(bool)]


def twin_key(table: pd.DataFrame, axis: str) -> list[str]:
    """Each row's case without ``axis``: its other axes and drawn lengths, so that two cases differing only in
    ``axis`` (a feature on and off, the two wrapper modes) share a key."""
    from dataclasses import fields

    from swabench.core.cases import Case

    key = [f.name for f in fields(Case) if f.name in table.columns and f.name != axis]
    key += ["length_dist"] * ("length_dist" in table.columns)
    return [repr(k) for k in zip(*(table[c] for c in key))]


def feature_costs(table: pd.DataFrame) -> pd.DataFrame:
    """Each timed point whose case asks for a serving feature (sinks, a soft-cap, an fp8 cache) against
    its plain twin: the same shape with the feature off, through the same implementation and backend
    where that ran, else through the reference path of its storage on the same backend (the sink
    wrapper runs only cases with sinks).  One row per point: feature, twin_impl, twin_us, ratio."""
    import pandas as pd

    from swabench.impls import registry

    t = table[(table["kind"] == "correct") & (table["status"] == "pass") & table["median_us"].notna()]
    parts = []
    for feature, column in FEATURES.items():
        on = _feature_on(t, column)
        if not on.any() or on.all():
            continue
        keyed = t.assign(_twin=twin_key(t, column))
        plain = keyed[~on][["_twin", "impl", "backend", "median_us"]].rename(
            columns={"median_us": "twin_us", "impl": "twin_impl"})
        asked = keyed[on]
        same = asked.merge(plain, left_on=["_twin", "impl", "backend"], right_on=["_twin", "twin_impl", "backend"])
        rest = asked[~asked.set_index(["_twin", "impl", "backend"]).index.isin(
            same.set_index(["_twin", "impl", "backend"]).index)]
        rest = rest.assign(twin_impl=rest["storage"].map(lambda s: (registry.reference_path(s) or (None,))[0]))
        other = rest.merge(plain, on=["_twin", "twin_impl", "backend"])
        parts.append(pd.concat([same, other]).assign(feature=feature))
    if not parts:
        return t.iloc[0:0].assign(feature=[], twin_impl=[], twin_us=[], ratio=[])
    out = pd.concat(parts, ignore_index=True).drop(columns="_twin")
    return out.assign(ratio=out["median_us"] / out["twin_us"])
