"""Which path an engine should run for each model preset and step: on a paged cache (engines keep their caches in
pages), the fastest correct path over the shapes a run measured, the shapes it held for, the runner-up and whether
the two differ by more than the points' own noise, and where the answer does not hold (a kernel built for Hopper
only, the shapes another path won).  A path over ragged K/V is an answer only beside the paged one, where it is
faster on the same shapes: it needs a ragged KV layout, which a paged engine does not have."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from swabench.core.cases import MODES
from swabench.inputs import models

# backends whose kernels, as the suite builds and runs them, are Hopper's (SM90) own: an answer on them holds only
# on Hopper (docs/shelf.md, docs/backends.md)
HOPPER_ONLY = {"fa3": "FA3", "vllm-fa3": "FA3 (vLLM's build)", "sgl-fa3": "FA3 (SGLang's build)",
               "fa4": "FA4's SM90 kernel", "xqa": "XQA as built for SM90", "fmha-v2": "fmha v2"}
PAGED, RAGGED = "paged", "ragged"


def served(table: pd.DataFrame) -> pd.DataFrame:
    """The timed points of correct paths that passed, of model presets as served (each model's own sinks and
    soft-cap, not its plain twin), on caches that hold random data in every page a request keeps."""
    if "model" not in table:
        return table.iloc[0:0]
    t = table[(table["kind"] == "correct") & (table["status"] == "pass")].dropna(subset=["median_us", "model"])
    features = t.reindex(columns=["sinks", "logits_soft_cap"])
    keep = [models.serves(m, s, c) for m, s, c in zip(t["model"], features["sinks"], features["logits_soft_cap"])]
    keep = pd.Series(keep, index=t.index, dtype=bool)
    if "cache_fill" in t:
        keep &= t["cache_fill"].fillna("random") == "random"
    if "page_layout" in t:
        keep &= ~t["page_layout"].astype(str).str.startswith("evicted")
    return t[keep]


def context_of(t: pd.DataFrame) -> pd.Series:
    """Each point's context (keys cached before the step): its prefix, or for requests of drawn lengths the range
    they were drawn from ('4096..16384')."""
    drawn = t.reindex(columns=["length_dist"])["length_dist"].astype(object).fillna("").astype(str)
    drawn = drawn.str.extract(r"prefix_len=\[(?:\d+ of )?([\d.,]+?)(?: sum \d+)?\]")[0].fillna("")
    drawn = drawn.str.replace(",", "..", regex=False)
    return pd.Series([str(int(p)) if p == p else d or "?" for p, d in zip(t["prefix_len"], drawn)], index=t.index)


def _noise(t: pd.DataFrame) -> pd.Series:
    """Each point's spread, IQR / median (0 where the run recorded none)."""
    own = t["noise"] if "noise" in t else pd.Series(float("nan"), index=t.index)
    iqr = t["iqr_us"] / t["median_us"] if "iqr_us" in t else pd.Series(float("nan"), index=t.index)
    return own.fillna(iqr).fillna(0.0).astype(float)


def within_noise(ratio: float, noise: float) -> bool:
    """A ratio of two times is a tie when it is within the two points' summed spread (IQR / median) of 1 (at the bar
    too, whatever the float rounding of a division)."""
    return round(abs(ratio - 1), 12) <= round(noise, 12)


def ranked_cases(points: pd.DataFrame) -> pd.DataFrame:
    """Each point with ``behind`` (its time / the case's fastest) and ``leads`` (the fastest of its case, or within
    the noise of it)."""
    fastest = points.sort_values("median_us", kind="stable").groupby(["gpu", "case_id"], sort=False)
    best_us, best_spread = fastest["median_us"].transform("first"), fastest["spread"].transform("first")
    behind = points["median_us"] / best_us
    bar = points["spread"] + best_spread
    return points.assign(behind=behind, leads=[within_noise(r, n) for r, n in zip(behind, bar)])


def _order(points: pd.DataFrame) -> list[tuple[str, str]]:
    """Paths by the cases they lead (most first), then by their geometric mean time / each case's fastest."""
    score = points.assign(log=np.log(points["behind"].astype(float))).groupby("path", sort=False)
    score = score.agg(led=("leads", "sum"), behind=("log", "mean"))
    return list(score.sort_values(["led", "behind"], ascending=[False, True], kind="stable").index)


def against(points: pd.DataFrame, path, of) -> tuple[float, float, int]:
    """``path``'s median time / ``of``'s over the cases both timed, the median summed spread of the two there,
    and the cases."""
    a = points[points["path"] == path].set_index("case_id")
    b = points[points["path"] == of].set_index("case_id")
    both = a.index.intersection(b.index)
    if not len(both):
        return float("nan"), float("nan"), 0
    ratios = a.loc[both, "median_us"] / b.loc[both, "median_us"]
    return float(ratios.median()), float((a.loc[both, "spread"] + b.loc[both, "spread"]).median()), len(both)


@dataclass
class Answer:
    """One model preset's step on one storage and GPU, as the run that measured it on the most shapes says."""

    model: str
    mode: str
    storage: str
    gpu: str
    run: str
    path: tuple[str, str]
    shapes: int  # the cases of the step the run measured
    held: pd.DataFrame  # the answer's points where it was the fastest or within the noise of it
    runner: tuple[str, str] | None = None
    runner_ratio: float = float("nan")  # the runner-up's time / the answer's, median over the cases both timed
    runner_noise: float = float("nan")
    runner_shapes: int = 0  # the cases both timed
    lost: list[dict] = field(default_factory=list)  # run, shape (a row), winner, times (the answer's / the winner's)
    off_hopper: tuple[tuple[str, str], float] | None = None  # the best path not Hopper-only, its time / the answer's
    ragged_gain: float = float("nan")  # a ragged answer: the paged answer's time / its own on the same shapes

    @property
    def tie(self) -> bool:
        return self.runner is not None and within_noise(self.runner_ratio, self.runner_noise)


def _lost(points: pd.DataFrame, path, run: str) -> list[dict]:
    """The cases where ``path`` was not the fastest beyond the noise, or (in ``run``) did not run: the fastest there,
    ``run``'s first."""
    lost = []
    points = points.assign(other=points["run"] != run).sort_values("other", kind="stable")
    for (name, case), g in points.groupby(["run", "case_id"], sort=False):
        mine, best = g[g["path"] == path], g.loc[g["median_us"].idxmin()]
        if (mine.empty and name == run) or (len(mine) and not mine["leads"].iloc[0]):
            lost.append(dict(run=name, shape=best, winner=best["path"],
                             times=float(mine["median_us"].iloc[0] / best["median_us"]) if len(mine) else None))
    return lost


def answer(points: pd.DataFrame) -> Answer | None:
    """The answer for one model, step, storage and GPU from its points across runs (see ``points_of``)."""
    if points.empty:
        return None
    run = points.groupby("run", sort=False)["case_id"].nunique().idxmax()  # the first given of the broadest
    mine = points[points["run"] == run]
    order = _order(mine)
    path = order[0]
    first = mine.iloc[0]
    out = Answer(first["model"], first["mode"], first["storage"], first["gpu"], run, path, mine["case_id"].nunique(),
                 mine[(mine["path"] == path) & mine["leads"]], lost=_lost(points, path, run))
    for other in order[1:]:
        ratio, noise, both = against(mine, other, path)
        if both:
            out.runner, out.runner_ratio, out.runner_noise, out.runner_shapes = other, ratio, noise, both
            break
    if path[1] in HOPPER_ONLY:
        elsewhere = [p for p in order if p[1] not in HOPPER_ONLY and against(mine, p, path)[2]]
        out.off_hopper = (elsewhere[0], against(mine, elsewhere[0], path)[0]) if elsewhere else None
    return out


def points_of(runs) -> pd.DataFrame:
    """The served points of ``runs`` ((name, table, meta) each), with their run, GPU, context, path and spread, each
    ranked within its case; a case several runs of one GPU hold counts once, from the run that timed the most paths
    on it (the first given on a tie)."""
    found = [served(table).assign(run=name, gpu=meta.get("gpu") or "unknown GPU", given=i)
             for i, (name, table, meta) in enumerate(runs)]
    found = [f for f in found if len(f)]
    if not found:
        return pd.DataFrame()
    t = pd.concat(found, ignore_index=True)
    t = t.assign(context=context_of(t), path=list(zip(t["impl"], t["backend"])), spread=_noise(t))
    paths = t.groupby(["gpu", "case_id", "run"], sort=False)["path"].nunique().rename("paths").reset_index()
    paths = paths.merge(t[["run", "given"]].drop_duplicates(), on="run")
    keep = paths.sort_values(["paths", "given"], ascending=[False, True]).drop_duplicates(["gpu", "case_id"])
    t = t.merge(keep[["gpu", "case_id", "run"]], on=["gpu", "case_id", "run"])
    return ranked_cases(t)


def _ragged_gain(points: pd.DataFrame, paged: Answer, ragged: Answer) -> tuple[float, float]:
    """The paged answer's time / the ragged answer's on the shapes both timed in the ragged answer's run (batch,
    context, queries), median, and the two points' summed spread there."""
    run = points[points["run"] == ragged.run]
    key = ["batch_size", "context", "qo_len"]
    a = run[(run["storage"] == PAGED) & (run["path"] == paged.path)]
    b = run[(run["storage"] == RAGGED) & (run["path"] == ragged.path)]
    both = a.merge(b, on=key, suffixes=("_paged", "_ragged"))
    if both.empty:
        return float("nan"), float("nan")
    gains = both["median_us_paged"] / both["median_us_ragged"]
    return float(gains.median()), float((both["spread_paged"] + both["spread_ragged"]).median())


def decisions(runs) -> list[Answer]:
    """Per model preset (in models.toml's order), step and GPU: the paged answer, and beside it the ragged one where
    that is faster than the paged answer beyond the noise on the same shapes; a ragged answer never stands alone."""
    points = points_of(runs)
    if points.empty:
        return []
    model_order = {m: i for i, m in enumerate(models.MODELS)}
    said = []
    keys = points[["model", "mode", "gpu"]].drop_duplicates()
    keys = keys.sort_values(["model", "mode"], key=lambda c: c.map(model_order if c.name == "model" else
                                                                   {m: i for i, m in enumerate(MODES)}),
                            kind="stable")
    for model, mode, gpu in keys.itertuples(index=False):
        step = points[(points["model"] == model) & (points["mode"] == mode) & (points["gpu"] == gpu)]
        paged = answer(step[step["storage"] == PAGED])
        if paged is None:
            continue
        said.append(paged)
        ragged = answer(step[step["storage"] == RAGGED])
        if ragged is not None:
            gain, noise = _ragged_gain(step, paged, ragged)
            if gain == gain and gain > 1 and not within_noise(gain, noise):
                ragged.ragged_gain = gain
                said.append(ragged)
    return said
