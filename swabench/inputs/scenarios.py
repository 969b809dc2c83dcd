"""Scenario files: parse, validate, expand into points (case x implementation x backend).

A scenario is a TOML file::

    name = "quick"                      # optional, defaults to the file's stem
    description = "..."
    implementations = ["paged-window", "paged-mask"]

    [fixed]                             # values shared by every sweep group
    num_qo_heads = 8

    [[sweep]]                           # lists expand to their cartesian product
    mode = "verify"
    draft_tokens = [4, 16]
    window_left = [127, 1023]

    [[skip]]                            # combinations that make no sense
    when = "window_left >= seq_len"
    reason = "window covers the whole context"

Everything is checked before any work: a bad file raises ScenarioError naming the file, the field
and the allowed values.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from swabench.core import footprint, semantics, trees
from swabench.core.cases import QO_FIELD, SERVING_DEFAULTS, Case, Point, features_of, length_bound
from swabench.errors import did_you_mean
from swabench.impls import registry
from swabench.inputs.axes import (AXES, DEFAULTS, LENGTHS, MODE_AXES, MODEL_SETS, ScenarioError, check_axes,
                                 make_case, with_model)
from swabench.inputs.rules import Rule, RuleError, compile_rule
from swabench.store import reading

TOP_LEVEL = ("name", "description", "implementations", "fixed", "sweep", "skip")


@dataclass
class Scenario:
    name: str
    path: str
    text: str
    description: str
    implementations: list[str]
    points: list[Point]
    skipped: list[str] = field(default_factory=list)  # the rule's reason, once per skipped point
    unmodelled: dict[str, str] = field(default_factory=dict)  # implementation -> why a step of it is no point

    @property
    def cases(self) -> list[Case]:
        return list(dict.fromkeys(p.case for p in self.points))


# ---------------------------------------------------------------- skip rules

SKIP_NAMES = tuple(AXES) + ("kv_len", "impl", "backend", "group")


def _compile_rule(expr, path, where) -> Rule:
    """A [[skip]] rule's `when`, checked when the file loads (the Rule keeps `where` for messages)."""
    try:
        return compile_rule(expr, SKIP_NAMES, where=where)
    except RuleError as e:
        raise ScenarioError(path, where, str(e)) from None




def _rule_namespace(combo: dict, group: str) -> dict:
    """What a skip rule sees: every axis (None when unset), with both window conventions and the
    query count and total keys filled in whichever way the combination gives them; a length drawn
    per request reads as the largest it can be."""
    combo = {k: (length_bound(v) if k in LENGTHS and v is not None else v) for k, v in with_model(combo).items()}
    ns = {name: combo.get(name, DEFAULTS.get(name)) for name in AXES}
    if ns["window_left"] is None and ns["sliding_window"] is not None:
        ns["window_left"] = semantics.window_left_from(sliding_window=ns["sliding_window"])
    if ns["window_left"] is not None:
        ns["sliding_window"] = semantics.sliding_window_of(ns["window_left"])
    if ns["qo_len"] is None:
        ns["qo_len"] = 1 if ns["mode"] == "decode" else ns.get(QO_FIELD.get(ns["mode"], ""), None)
    if ns["qo_len"] is None and str(ns["tree"]).startswith("["):
        ns["qo_len"] = trees.node_count(ns["tree"], None)  # a choice list says how many queries it verifies
    ns["kv_len"] = ns["seq_len"] if ns["seq_len"] is not None else \
        (ns["prefix_len"] + ns["qo_len"] if None not in (ns["prefix_len"], ns["qo_len"]) else None)
    ns["kv_dtype"] = ns["kv_dtype"] or ns["dtype"]
    if ns["sm_scale"] is None and ns["head_dim"]:
        ns["sm_scale"] = ns["head_dim"] ** -0.5
    ns["group"] = group
    return ns


def _skip_reason(rules, ns: dict, path) -> str | None:
    for rule, reason in rules:
        try:
            if rule.evaluate(ns):
                return reason
        except RuleError as e:  # e.g. comparing an unset axis (None) with a number
            raise ScenarioError(path, rule.where, f"cannot be evaluated for {ns['group']}: {e}") from None
    return None


# ---------------------------------------------------------------- loading

def _check_impls(names, path, where) -> list[str]:
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        where_else = " (at the top level, or in every [[sweep]] group)" if names is None else ""
        raise ScenarioError(path, where, f"must be a non-empty list of names{where_else}; allowed: "
                                         f"{', '.join(registry.names())}")
    for n in names:
        if not registry.known(n):
            raise ScenarioError(path, where, f"unknown implementation {n!r}{did_you_mean(n, registry.names())};"
                                             f" allowed: {', '.join(registry.names())}")
    return list(dict.fromkeys(names))


def load(path, impl_filter=None) -> Scenario:
    """Read, validate and expand a scenario file. Raises ScenarioError on any problem."""
    doc, text = read(path)
    return parse(doc, path, text, impl_filter)


MAX_BYTES = reading.SCENARIO


def read(path) -> tuple[dict, str]:
    """The file's TOML document and text, unexpanded (ScenarioError if it cannot be read or parsed)."""
    path = Path(path)

    def error(reason: str) -> ScenarioError:
        return ScenarioError(path, "file", reason)

    text = reading.read_text(path, MAX_BYTES, error)
    return reading.toml_document(text, error), text


NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 100 characters"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_name(name) -> str:
    """A scenario name is a slug: it names the run folder, which must stay under the results root."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"must be {NAME_RULE}; got {name!r}")
    return name


def declared_name(doc: dict, path) -> str:
    """The scenario's ``name`` (checked), else its file's stem made a slug."""
    if "name" in doc:
        try:
            return check_name(doc["name"])
        except ValueError as e:
            raise ScenarioError(path, "name", str(e)) from None
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(path).stem).lstrip("._-")[:100]
    return stem or "scenario"


def parse(doc: dict, path="<scenario>", text="", impl_filter=None) -> Scenario:
    for key in doc:
        if key not in TOP_LEVEL:
            hint = " (sweep axes go under [fixed] or [[sweep]])" if key in AXES else did_you_mean(key, TOP_LEVEL)
            raise ScenarioError(path, key, f"unknown top-level key{hint}; allowed: {', '.join(TOP_LEVEL)}")
    name = declared_name(doc, path)
    groups = doc.get("sweep", [{}])
    groups = [groups] if isinstance(groups, dict) else groups
    if not isinstance(groups, list) or not groups:
        raise ScenarioError(path, "sweep", "must be one [sweep] table or a list of [[sweep]] tables")
    everywhere = None if "implementations" not in doc and all(isinstance(g, dict) and "implementations" in g
                                                              for g in groups) else \
        _check_impls(doc.get("implementations"), path, "implementations")
    wanted = _check_impls(list(impl_filter), path, "--impl") if impl_filter else None
    fixed = check_axes(doc.get("fixed", {}), path, "fixed")
    rules = []
    for i, rule in enumerate(doc.get("skip", [])):
        where = f"skip[{i}]"
        if not isinstance(rule, dict) or set(rule) - {"when", "reason"} or "when" not in rule:
            raise ScenarioError(path, where, "must be a table with 'when' (an expression) and 'reason'")
        rules.append((_compile_rule(rule["when"], path, f"{where}.when"), str(rule.get("reason", rule["when"]))))

    points, skipped, listed, checked, expanded, unmodelled = [], [], [], [], 0, {}
    for gi, group in enumerate(groups):
        group = dict(group) if isinstance(group, dict) else group
        label = group.pop("group", f"sweep[{gi}]") if isinstance(group, dict) else f"sweep[{gi}]"
        where = f"sweep[{gi}]"
        impls = _check_impls(group.pop("implementations"), path, f"{where}.implementations") \
            if isinstance(group, dict) and "implementations" in group else everywhere
        listed += impls
        impls = [n for n in impls if wanted is None or n in wanted]
        own = check_axes(group, path, where)
        clash = [a for a in MODEL_SETS if a in own or ("model" in fixed and a in fixed)] \
            if "model" in own or "model" in fixed else []
        if clash:
            given_in = where if clash[0] in own else "fixed"
            raise ScenarioError(path, f"{given_in}.{clash[0]}", f"the model preset sets {clash[0]}: give the model "
                                                                f"or the shape, not both")
        axes = {**fixed, **own}
        if "model_features" in axes and "model" not in axes:
            raise ScenarioError(path, f"{where}.model_features", "applies to a model preset: give model too")
        _check_mode_axes(own, axes.get("mode"), path, where)
        backends = axes.pop("backend", [DEFAULTS["backend"]])
        expanded = check_size(path, where if label == where else f"{where} ({label})", axes, len(impls),
                              len(backends), expanded)
        checked.append((label, where, impls, axes, backends))
    _check_mode_axes(fixed, [m for group in checked for m in group[3].get("mode", ())], path, "fixed")
    for label, where, impls, axes, backends in checked:  # every group's size known before any is expanded
        names = list(axes)
        seen = set()
        for combo in itertools.product(*(axes[n] for n in names)):
            combo = dict(zip(names, combo))
            same = repr(sorted((k, v) for k, v in with_model(combo).items() if k != "model_features"))
            if same in seen:  # a preset without sinks or soft-cap: its plain twin is this very combination
                continue
            seen.add(same)
            case, step = None, _rule_namespace(combo, label)
            features = features_of(step["sinks"], step["logits_soft_cap"], step["kv_dtype"], step["attention_chunk"],
                                   step["tree"], step["block"])
            for impl_name in impls:
                impl = registry.get(impl_name)
                why = impl.unmodelled(step["storage"], step["mode"], features, step["wrapper_mode"], backends)
                if why:  # a step the implementation does not model: not a point
                    unmodelled.setdefault(impl_name, why)
                    continue
                for backend in impl.runs_on(backends):
                    ns = {**step, "impl": impl_name, "backend": backend}
                    reason = _skip_reason(rules, ns, path)
                    if reason:
                        skipped.append(reason)
                        continue
                    case = case or make_case(combo, path, where)
                    points.append(Point(case, impl_name, backend, label))
    points = list(dict.fromkeys(points))
    listed = list(dict.fromkeys(listed))
    if wanted is not None and not set(wanted) & set(listed):
        _no_impl_left(path, wanted, listed)
    return Scenario(name=name, path=str(path), text=text, description=str(doc.get("description", "")),
                    implementations=[n for n in listed if wanted is None or n in wanted], points=points,
                    skipped=skipped, unmodelled=unmodelled)


def _check_mode_axes(given: dict, modes, path, where: str) -> None:
    """ScenarioError for an axis of ``given`` (a [[sweep]] group's or [fixed]'s checked axes, each a list of values)
    that none of ``modes`` (the modes it reaches) uses: its cases would be made without it.  An axis only at its off
    value (tree none, block 0, prefills 0) asks for nothing, and fits any mode."""
    for name, takes in MODE_AXES.items():
        if modes and any(v != SERVING_DEFAULTS.get(name) for v in given.get(name, ())) and not set(takes) & set(modes):
            raise ScenarioError(path, f"{where}.{name}", f"applies to {_listed(takes)}, not to {_listed(modes)} "
                                                         f"(leave it out)")


def _listed(modes) -> str:
    """"mode 'decode'", "modes 'verify' and 'draft_extend'", "modes 'extend', 'verify' and 'mixed'"."""
    said = [repr(m) for m in dict.fromkeys(modes)]
    return f"mode{'s' * (len(said) > 1)} " + " and ".join(filter(None, [", ".join(said[:-1]), said[-1]]))


MAX_POINTS = 250_000  # days of GPU time; the largest shipped, edges.toml, counts 54k before its skip rules


def check_size(path, where: str, axes: dict, impls: int, backends: int, before: int = 0) -> int:
    """The points so far once a group's axes (each a list) expand, counted before anything is expanded:
    ``before`` plus the product of its lists' lengths, implementations and backends; ScenarioError past
    MAX_POINTS."""
    points = math.prod(len(v) for v in axes.values()) * impls * backends
    if before + points <= MAX_POINTS:
        return before + points
    factors = [f"{len(v)} {a}" for a, v in axes.items() if len(v) > 1] + [f"{impls} implementations",
                                                                          f"{backends} backends"]
    so_far = f", {before + points} with the groups before it" if before else ""
    raise ScenarioError(path, where, f"expands to {points} points ({' x '.join(factors)}{so_far}): more than the "
                                     f"{MAX_POINTS} a scenario may sweep; give fewer values (or --impl), or split "
                                     f"it into scenarios run one after another")


def _no_impl_left(path, wanted, available):
    raise ScenarioError(path, "--impl", f"none of {', '.join(wanted)} is in this scenario; "
                                        f"it runs: {', '.join(available)}")


def find(name_or_path: str, search_dirs=None) -> Path:
    """A scenario by path (a run folder's own scenario.toml for a run folder), or by name in ./scenarios and then
    among the shipped ones."""
    p = Path(name_or_path)
    if p.is_dir() and (p / "scenario.toml").is_file():
        return p / "scenario.toml"
    if p.suffix == ".toml" or p.exists():
        return p
    dirs = search_dirs or scenario_dirs()
    for d in dirs:
        candidate = d / f"{name_or_path}.toml"
        if candidate.exists():
            return candidate
    known = sorted({f.stem for d in dirs if d.is_dir() for f in d.glob("*.toml")})
    raise ScenarioError(name_or_path, "scenario", f"no such file or scenario name"
                                                  f"{did_you_mean(name_or_path, known)}; known: {', '.join(known)}")


def shipped_dir() -> Path:
    """The shipped scenario files: package data of the installed package (the checkout's top-level
    scenarios/, mapped by pyproject.toml), or the checkout's own folder when run from a checkout."""
    spec = importlib.util.find_spec("swabench.scenario_files")  # a namespace package: a folder of .toml files
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(__file__).resolve().parents[2] / "scenarios"


def scenario_dirs() -> list[Path]:
    """Where names are looked up: ./scenarios first (a user's own files), then the shipped ones."""
    dirs = [Path.cwd() / "scenarios", shipped_dir()]
    return list({d.resolve(): d for d in dirs}.values())


def matches(point, cases) -> bool:
    """Whether the point's case id starts with, its label contains, or its [[sweep]] group is, one of ``cases``."""
    return any(point.case.case_id.startswith(c) or c in point.case.label or c == point.group for c in cases)


def select(scenario: Scenario, cases) -> Scenario:
    """Keep the points ``cases`` match (``matches``)."""
    if not cases:
        return scenario
    keep = [p for p in scenario.points if matches(p, cases)]
    if not keep:
        raise ScenarioError(scenario.path, "--case", f"no case of {scenario.name} matches {', '.join(cases)} "
                                                     f"(give a case_id prefix, part of a label or a group, see "
                                                     f"`swabench show`)")
    scenario.points = keep
    return scenario


def select_model(scenario: Scenario, model: str | None) -> Scenario:
    """Keep the points of ``model``'s cases (``model = ...`` in the scenario)."""
    if not model:
        return scenario
    keep = [p for p in scenario.points if p.case.model == model]
    if not keep:
        present = sorted({p.case.model for p in scenario.points} - {None})
        raise ScenarioError(scenario.path, "--model", f"no case of {scenario.name} is for {model}; its models: "
                                                      f"{', '.join(present) or 'none (it sets no model axis)'}")
    scenario.points = keep
    return scenario


def axis_values(cases) -> dict:
    """Each axis and the values the cases give it, in order of appearance."""
    out = {}
    for case in cases:
        for k, v in case.axes().items():
            if v is not None and v not in out.setdefault(k, []):
                out[k].append(v)
    return out


def listing() -> str:
    """One line per scenario file that ``find`` can name, the broken ones with their error."""
    lines = []
    for d in scenario_dirs():
        for path in sorted(d.glob("*.toml")) if d.is_dir() else []:
            try:
                s = load(path)
                lines.append(f"  {s.name:10s} {len(s.points):5d} points  {s.description}")
            except ScenarioError as e:
                lines.append(f"  {path.stem:10s} invalid: {e}")
    return "\n".join(lines)


def describe(s: Scenario, each_case: bool = False) -> str:
    """What ``swabench show`` prints: points per implementation, the axes, the largest case's memory
    estimate (every case's with ``each_case``), and the points the skip rules removed."""
    lines = [f"{s.name}: {s.description}", f"file: {s.path}",
             f"{len(s.cases)} cases, {len(s.points)} points (case x implementation x backend)"]
    per_impl = Counter(p.impl for p in s.points)
    for name in s.implementations:
        backends = sorted({p.backend for p in s.points if p.impl == name})
        why = f"  ({s.unmodelled[name]})" if not per_impl[name] and name in s.unmodelled else ""
        lines.append(f"  {name:22s} {registry.get(name).kind:9s} {per_impl[name]:5d} points  "
                     f"backends: {', '.join(backends) or '-'}" + why)
    lines.append("axes:")
    lines += [f"  {axis:14s} {', '.join(map(str, values))}" for axis, values in axis_values(s.cases).items()]
    sizes = {c: footprint.footprint(c, "cuda") for c in s.cases}
    if sizes:
        big = max(sizes, key=lambda c: sizes[c].device_bytes)
        lines.append(f"memory: the largest case needs {sizes[big].describe()}: {big.label}")
    lines += [f"  {c.case_id}  {sizes[c].describe():44s} {c.label}" for c in s.cases if each_case]
    if s.skipped:
        lines.append(f"skipped by the scenario's rules: {len(s.skipped)} points")
        lines += [f"  {n:5d}  {reason}" for reason, n in Counter(s.skipped).most_common()]
    return "\n".join(lines)
