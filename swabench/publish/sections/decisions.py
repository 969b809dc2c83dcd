"""The decision table an engine builder reads first: per model preset and step, the path to run on a paged KV cache,
the shapes it held for, the runner-up (a tie where the two differ by less than their points' noise), the GPU and
where the answer does not hold; a ragged K/V path beside it only where it is faster on the same shapes."""

from __future__ import annotations

import pandas as pd

from swabench.analysis import decisions
from swabench.analysis.decisions import HOPPER_ONLY, Answer
from swabench.publish.markdown import markdown_table
from swabench.publish.sections import serving
from swabench.publish.sections.base import FINDINGS, Run, Section, micros, ranged, ratio, topic_link

MOST_LOSSES = 3  # groups of shapes another path won that a cell names; past them, a count
COLUMNS = ["model", "step", "KV cache", "fastest correct path", "its time (us)", "holds for",
           "runner-up: its time / the fastest's", "does not hold", "GPU", "run"]


def path_words(path: tuple[str, str]) -> str:
    return f"`{path[0]}` [{path[1]}]"


def _values(values, words=str) -> str:
    """'1/64', '512/16k': distinct values, least first (a drawn range by its least), each once."""
    def least(value) -> float:
        head = str(value).split("..")[0]
        return float(head) if head.replace(".", "", 1).isdigit() else float("inf")
    return "/".join(words(v) for v in sorted(set(values), key=lambda v: (least(v), str(v))))


def keys_words(value) -> str:
    """A count of keys as a reader reads it: 512, 4k, 16k, 4k..16k (drawn lengths)."""
    text = str(value)
    if ".." in text:
        return "..".join(keys_words(part) for part in text.split("..")) + " drawn"
    number = int(float(text)) if text.replace(".", "").isdigit() else None
    if number is None:
        return text
    return f"{number // 1024}k" if number >= 1024 and number % 1024 == 0 else str(number)


def shapes_words(points: pd.DataFrame) -> str:
    """'batch 1/64, context 512/16k, page 1/16' over the points' shapes (no page on ragged K/V)."""
    pages = points["page_size"].dropna() if "page_size" in points else pd.Series(dtype=float)
    return ", ".join(filter(None, [f"batch {_values(points['batch_size'].astype(int))}",
                                   f"context {_values(points['context'], keys_words)}",
                                   f"page {_values(pages.astype(int))}" if len(pages) else ""]))


def held_words(a: Answer) -> str:
    held = a.held["case_id"].nunique()
    share = "its one shape" if a.shapes == 1 else f"all {a.shapes} shapes" if held == a.shapes else \
        f"{held} of {a.shapes} shapes"
    return f"{shapes_words(a.held)} ({share})"


def times(x: float, tie: bool = False) -> str:
    """A ratio of two times: three significant digits, or four where those read 1.00 and the two are apart."""
    shown = ratio(x)
    return f"{x:.3f}x" if shown == "1.00" and not tie else f"{shown}x"


def runner_words(a: Answer) -> str:
    if a.runner is None:
        return "no other correct path ran"
    said = f"{path_words(a.runner)} {times(a.runner_ratio, a.tie)}"
    said += f" on the {a.runner_shapes} shapes it ran" if a.runner_shapes < a.shapes else ""
    return said + (f", a tie (noise {a.runner_noise:.1%})" if a.tie else "")


def _lost_words(a: Answer) -> list[str]:
    """The shapes another path won, grouped by winner and run: 'batch 64, context 512, page 1: `x` [fa2] up to 1.09x
    faster'; a run other than the row's is named."""
    if not a.lost:
        return []
    lost = pd.DataFrame([{**lost, "winner": path_words(lost["winner"])} for lost in a.lost])
    said = []
    for (run, winner), g in lost.groupby(["run", "winner"], sort=False):
        ahead = g["times"].dropna()
        how = [f"up to {times(ahead.max())} faster"] if len(ahead) else []
        how += ["where the answer did not run"] if len(ahead) < len(g) else []
        said.append(f"{shapes_words(pd.DataFrame(list(g['shape'])))}: {winner} {' and '.join(how)}"
                    + (f" (`{run}`)" if run != a.run else ""))
    if len(said) > MOST_LOSSES:
        said = said[:MOST_LOSSES] + [f"{len(said) - MOST_LOSSES} more"]
    return said


def not_held_words(a: Answer) -> str:
    said = []
    if a.path[1] in HOPPER_ONLY:
        said.append(f"SM90 only ({HOPPER_ONLY[a.path[1]]}): " + (
            f"elsewhere {path_words(a.off_hopper[0])} {times(a.off_hopper[1])}" if a.off_hopper else
            "no other path ran its shapes"))
    said += _lost_words(a)
    return "; ".join(said)


def storage_words(a: Answer) -> str:
    if a.storage == decisions.PAGED:
        return "paged"
    return f"ragged: needs a ragged KV layout; {times(a.ragged_gain)} faster than paged"


def row(a: Answer) -> dict:
    return dict(zip(COLUMNS, [a.model, a.mode.replace("_", " "), storage_words(a), path_words(a.path),
                              ranged(a.held["median_us"], micros), held_words(a), runner_words(a), not_held_words(a),
                              str(a.gpu).removeprefix("NVIDIA "), f"`{a.run}`"]))


def table(runs: list[Run]) -> pd.DataFrame:
    return pd.DataFrame([row(a) for a in decisions.decisions([(r.folder, r.table, r.meta) for r in runs])],
                        columns=COLUMNS)


def decision_table(runs: list[Run]) -> list[str]:
    t = table(runs)
    return [markdown_table(t), f"Its time: over the shapes it held for. 'Does not hold' is blank where the answer "
                               f"held on every shape measured; 'SM90 only': a kernel built for Hopper alone (FA4 runs "
                               f"another on Blackwell), 'elsewhere' the fastest path that is not, its time / the "
                               f"answer's. Each model's steps, run by run: {topic_link(serving)}."] if len(t) else []


SECTIONS = [
    Section("decisions", "Which path to run: per model and step, on a paged KV cache",
            "Per model preset as served (its own sinks and soft-cap) and step, from the run that measured it on the "
            "most shapes: the fastest correct path, the shapes where it was the fastest or within the noise of it "
            "(batch, context in keys, page in tokens), the runner-up (a tie where the two differ by less than their "
            "points' summed IQR / median), and where the answer does not hold.  Engines keep paged caches: a ragged "
            "K/V row stands beside the paged one only where it is faster on the same shapes.",
            pages=frozenset({FINDINGS}), across=decision_table, timed=True),
]
