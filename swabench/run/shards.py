"""Spreading a sweep: which points each shard runs, and merging the shards' run folders back into
one (``launch`` starts the processes: one per GPU, or a job array across nodes).

A shard is a set of points; a case's points stay together (one workload build, one set of
references), except those of an implementation compiled per process (FlexAttention), which gather
where their compiles are paid once.  Units are dealt longest-first to the least-loaded shard, by
their cost in an earlier run when one is given (``--costs-from``), else by an estimate.  Each
worker writes an ordinary run folder; ``merge`` checks they ran the same scenario file and unions
their rows, keeping each row's GPU identity.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

from swabench.analysis import derived
from swabench.store import reading, run_folder, schema
from swabench.errors import UserError
from swabench.impls import registry
from swabench.inputs.scenarios import Scenario

if TYPE_CHECKING:
    import pandas as pd


class ShardError(UserError, ValueError):
    pass


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ShardError(f"--shard: expected I/N (e.g. 0/4), got {text!r}") from None
    if not 0 <= i < n:
        raise ShardError(f"--shard: need 0 <= I < N, got {text!r}")
    return i, n


def check_count(count: int, points: int, what: str = "--shards") -> None:
    """ShardError when a sweep of ``points`` points is cut into more shards than it has points: every shard of at
    most that many holds a point (``assign``), and no more are made (a count too big for memory included)."""
    if count > points:
        raise ShardError(f"{what}: {count} shards, but the sweep has only {points} point(s); use at most {points} "
                         f"shards")


# Estimates for a scenario no earlier run has costed, from default.toml on the H200 x2 node: a
# point takes 0.1-0.15 s outside FlexAttention's compiles, which take 10-45 s a kernel.
POINT_S = 0.12
COMPILE_S = 20.0


def describe_costs(costs_from) -> str:
    """How a shard's point costs were known, for its meta.json."""
    if costs_from:
        return f"measured in {costs_from}"
    return f"estimated ({POINT_S} s a point, {COMPILE_S} s a per-process compiled kernel)"


def point_costs(folder) -> dict[tuple, float] | None:
    """Seconds each point took in an earlier run folder, its case's workload build charged to the
    case's first point (None without a folder: the shards use estimates)."""
    if not folder:
        return None
    table, _ = run_folder.load(folder)
    if table["point_s"].isna().all():
        raise ShardError(f"--costs-from {folder}: this run has no point_s column (made before swabench "
                         f"recorded it); give a newer run folder, or leave the option out")
    first = ~table["case_id"].duplicated()
    seconds = table["point_s"] + table["workload_s"].fillna(0.0).where(first, 0.0)
    return dict(zip(map(tuple, table[list(run_folder.KEY)].values), seconds))


def _units(points, cost: dict, count: int, charge: float) -> list[tuple[float, int, list]]:
    """Sets of points that go to one shard together, as (cost, first point's position, points).

    A case's points stay together: they share one workload build and one set of references.  The
    points of an implementation compiled per process (FlexAttention) gather apart from their cases
    (a split case only builds its workload twice): all in one shard when they fit in its share, so
    its one-time set-up is paid once and no two workers compile at once (on the H200 x2 node,
    concurrent compiles ran up to 50% slower); else one shard per compiled kernel
    (``compile_class``); a kernel bigger than a share is split into its points.  An estimate holds no
    compiles: ``charge`` adds one per kernel.
    """
    order = {p.key: i for i, p in enumerate(points)}
    plain: dict = {}  # case -> points
    compiled: dict = {}  # implementation -> compile class -> points
    for p in points:
        make_class = registry.get(p.impl).compile_class
        if make_class:
            compiled.setdefault(p.impl, {}).setdefault(make_class(p.case), []).append(p)
        else:
            plain.setdefault(p.case, []).append(p)

    def unit(pts, kernels):
        return (sum(cost[p.key] for p in pts) + charge * kernels, order[pts[0].key], pts)

    kernels = sum(len(classes) for classes in compiled.values())
    share = (sum(cost.values()) + charge * kernels) / count
    units = [unit(pts, 0) for pts in plain.values()]
    for classes in compiled.values():
        whole = unit([p for pts in classes.values() for p in pts], len(classes))
        if whole[0] <= share + COMPILE_S:
            units.append(whole)
            continue
        for pts in classes.values():
            one = unit(pts, 1)
            units += [one] if one[0] <= share + COMPILE_S else [unit([p], 0) for p in pts]
    return _at_least(units, count, order)


def _at_least(units: list, count: int, order: dict) -> list:
    """``units`` with the costliest of several points halved (its points in order, its cost shared by their number)
    until there are ``count`` of them, where the points allow: no shard is left without a point while a case of
    several waits on another."""
    units = list(units)
    while len(units) < count and any(len(pts) > 1 for _, _, pts in units):
        cost, first, pts = max((u for u in units if len(u[2]) > 1), key=lambda u: (u[0], -u[1]))
        units.remove((cost, first, pts))
        half = len(pts) // 2
        units += [(cost * len(part) / len(pts), order[part[0].key], part) for part in (pts[:half], pts[half:])]
    return units


def assign(scenario: Scenario, count: int, costs: dict[tuple, float] | None = None) -> dict:
    """Point key -> shard index: units (``_units``) longest first onto the least-loaded shard (ties
    to the lower index and the earlier point, so every process computes the same answer)."""
    cost = {p.key: (costs or {}).get(p.key, POINT_S) for p in scenario.points}
    units = sorted(_units(scenario.points, cost, count, COMPILE_S if costs is None else 0.0),
                   key=lambda u: (-u[0], u[1]))
    load, held, where = [0.0] * count, [0] * count, {}
    for unit_cost, _, pts in units:
        target = min(range(count), key=lambda i: (load[i], held[i] > 0, i))  # an empty shard first, at a tie
        load[target] += unit_cost
        held[target] += 1
        where.update({p.key: target for p in pts})
    return where


def select_shard(scenario: Scenario, spec: str, costs_from=None) -> dict:
    """Keep shard ``spec`` ('I/N') of the scenario's points; what to record of it in meta.json."""
    index, count = parse_shard(spec)
    sweep_points = len(scenario.points)
    check_count(count, sweep_points, f"--shard {spec}")
    shard(scenario, index, count, point_costs(costs_from))
    return {"index": index, "count": count, "cases": len(scenario.cases), "sweep_points": sweep_points,
            "costs": describe_costs(costs_from)}


def shard(scenario: Scenario, index: int, count: int, costs: dict[tuple, float] | None = None) -> Scenario:
    """Keep the points ``assign`` gives to shard ``index``."""
    where = assign(scenario, count, costs)
    scenario.points = [p for p in scenario.points if where[p.key] == index]
    return scenario


def check_complete(metas: list[dict], folders) -> str | None:
    """Why these shard folders are not every shard of one sweep (None when they are, or when none
    was made as a shard); ShardError when one records no shard of that sweep (an index and count with
    0 <= index < count <= the sweep's points, and the sweep's points as the others record them) or two are the
    same shard."""
    sharding = [m.get("sharding") for m in metas]
    if not any(sharding):
        return None
    if not all(isinstance(s, dict) for s in sharding):
        return "some folders are not shards (their meta.json records no sharding)"
    planned = {s.get("sweep_points") for s in sharding}
    if len(planned) > 1:
        raise ShardError(f"the shards record sweeps of different sizes ({', '.join(map(str, planned))} points): "
                         f"only shards of one sweep merge")
    points = planned.pop()
    for s, folder in zip(sharding, folders):
        if not _is_shard(s, points):
            raise ShardError(f"{folder}: its meta.json records the shard {s.get('index')!r}/{s.get('count')!r}, "
                             f"not one of a sweep of {points if _counts(points) else 'its'} points (need "
                             f"0 <= index < count <= the points)")
    counts = {s["count"] for s in sharding}
    if len(counts) != 1:
        return f"the shards were cut into different numbers of parts ({sorted(counts)})"
    count = counts.pop()
    indices = [s["index"] for s in sharding]
    twice = sorted({i for i in indices if indices.count(i) > 1})
    if twice:
        raise ShardError(f"shard(s) {', '.join(f'{i}/{count}' for i in twice)} given more than once: "
                         f"overlapping shards")
    if len(indices) < count:
        missing = [f"{i}/{count}" for i in itertools.islice((i for i in range(count) if i not in indices), 4)]
        more = f", ... ({count - len(indices)} in all)" if count - len(indices) > len(missing) else ""
        return f"shard(s) {', '.join(missing)}{more} missing from {len(folders)} folder(s)"
    return None


def _counts(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_shard(sharding: dict, points) -> bool:
    """Whether ``sharding`` (a shard's meta.json record) names a shard of a sweep of ``points`` points (or, where the
    shard did not record them, of some sweep)."""
    index, count = sharding.get("index"), sharding.get("count")
    most = points if _counts(points) else count
    return _counts(index) and _counts(count) and 0 <= index < count <= most


def unfinished_shards(metas: list[dict], folders) -> str | None:
    """Which folders did not finish their points (state other than complete), with their state."""
    named = [f"{folder}" + (f" (shard {m['sharding']['index']}/{m['sharding']['count']})"
                            if isinstance(m.get("sharding"), dict) and "index" in m["sharding"] else "")
             + f" is {m.get('state') or 'of unknown state'}"
             for m, folder in zip(metas, folders) if m.get("state", "complete") != "complete"]
    return "; ".join(named) or None


def sweep_points(metas: list[dict], whole: bool) -> int | None:
    """The points the whole sweep planned: what each shard recorded of it, else (shards from before
    they recorded it) the shards' own planned points summed when every shard is there, else unknown."""
    recorded = {m["sharding"].get("sweep_points") for m in metas if isinstance(m.get("sharding"), dict)}
    if len(recorded) == 1 and isinstance(next(iter(recorded)), int):
        return recorded.pop()
    if whole:
        return sum(m.get("points") or 0 for m in metas) or None
    return None


def merge(out: Path, folders: list[Path], partial: bool = False) -> tuple[run_folder.RunStore, pd.DataFrame]:
    """One run folder from the shards of one scenario file: its store and table.  Refuses a set that
    misses shards, or whose rows are fewer than the sweep's points, unless ``partial`` (the merged folder then says
    it is incomplete)."""
    from swabench.run import environment

    metas = [run_folder.read_meta(f) for f in folders]
    hashes = {m.get("scenario_sha256") for m in metas}
    if len(hashes) != 1:
        raise ShardError("these run folders ran different scenario files; only shards of one sweep merge")
    if len({(m.get("patch") or {}).get("sha256") for m in metas}) != 1:
        raise ShardError("these run folders ran different patches of the library (meta.json's patch), or some one "
                         "and some none; only shards of one sweep merge")
    gap = check_complete(metas, folders)
    if gap and not partial:
        raise ShardError(f"{gap}; merge them all, or pass --partial to merge what is there")
    unfinished = unfinished_shards(metas, folders)
    if unfinished and not partial:
        raise ShardError(f"{unfinished}: resume them (the same `swabench run ... --shard I/N` with --resume), "
                         f"or pass --partial to merge what is there")
    scenario = Path(folders[0]) / run_folder.SCENARIO
    text = reading.read_text(scenario, reading.SCENARIO,
                             lambda reason: ShardError(f"{scenario}: {reason}: not a whole run folder"))
    rows, seen = [], {}
    for folder in folders:
        for row in run_folder.read_rows(folder):
            key = tuple(row[k] for k in run_folder.KEY)
            if key in seen:
                raise ShardError(f"point {key} is in both {seen[key]} and {folder}: overlapping shards")
            seen[key] = folder
            rows.append(row)
    per_shard = ("rows", "status_counts", "wall_s", "setup_s", "total_s", "sharding", "state", "points",
                 "selection", "cuda_visible_devices", "gpu_uuid", "host", "format_version")
    meta = {k: v for k, v in metas[0].items() if k in schema.META_KEYS and k not in per_shard}
    points = sweep_points(metas, whole=not gap)
    short = None if gap or unfinished or points is None or len(rows) == points else \
        f"the shards hold {len(rows)} of the sweep's {points} points, though their meta.json says they are all of it"
    if short and not partial:
        raise ShardError(f"{short}; merge every shard of the sweep, or pass --partial to merge what is there")
    meta.update(host=", ".join(sorted({str(m.get("host")) for m in metas})), shards=metas,
                merged_from=[str(f) for f in folders], what=f"merge of {len(folders)} shards",
                wall_s=max(m.get("wall_s", 0.0) for m in metas), command=environment.collect_command(),
                points=points)
    store = run_folder.RunStore.create(out, meta, text)
    try:
        store.extend(rows)
        whole = not gap and not unfinished and not short
        table = store.finalize(derived.add_derived, state="complete" if whole else "incomplete")
    finally:
        store.close()
    return store, table
