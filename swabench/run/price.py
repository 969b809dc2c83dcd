"""Whole-model step pricing: an SWA layer never runs alone.  A model's steps (its template steps from
``models.toml``, or a trace's lines of that model) become, per step, its windowed layer (sliding or chunked,
the preset) weighted by the number of such layers, and its global layer (the same heads and features, no
window) weighted by the rest; the replay machinery gates and times each, and analysis.price weighs them.
The KV bytes a request holds are counted here too: every page kept, and out-of-window pages evicted."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

from swabench.core import semantics
from swabench.errors import UserError
from swabench.inputs import models, traces

KV_BYTES = 2  # bf16 or fp16 cache elements
CPU_LIMIT_S = 600  # a price on the CPU longer than this (on an idle CPU) is refused before it starts
SMALL_TRACE = "traces/small.jsonl"  # a trace of the repository small enough to price on a CPU


def preset(name: str) -> models.Model:
    try:
        return models.get(name)
    except ValueError as e:
        raise UserError(f"--model: {e}") from None


def template_steps(model: models.Model) -> Counter:
    """The model's steps in ``models.toml`` (paged, as served), one each: draft extend counts as extend."""
    from swabench.core import workloads
    from swabench.inputs import scenarios

    s = scenarios.select_model(scenarios.load(scenarios.find("models")), model.name)
    steps = Counter()
    for case in dict.fromkeys(c for c in s.cases if c.storage == "paged" and models.serves(
            model.name, c.sinks, c.logits_soft_cap)):
        qo_lens, kv_lens = workloads.request_lengths(case)
        mode = "extend" if case.mode == "draft_extend" else case.mode
        steps[traces.Step(mode, (("model", model.name),), tuple((k - q, q) for q, k in zip(qo_lens, kv_lens)))] = 1
    return steps


def trace_steps(model: models.Model, trace) -> Counter:
    """A trace's lines of this model, served as the preset has it (UserError for a line that sets more)."""
    steps = Counter()
    for step, count in traces.read(trace).items():
        layer = dict(step.layer)
        if layer.get("model") != model.name:
            continue
        extra = sorted(set(layer) - {"model"})
        if extra:
            raise UserError(f"{trace}: a line of {model.name} sets {extra[0]}: price takes the model as its preset "
                            f"serves it, 16-token pages in its dtype (leave {extra[0]} out)")
        steps[step] += count
    if not steps:
        raise UserError(f"{trace}: no line of model {model.name!r} (a line names its layer with \"model\": "
                        f"\"{model.name}\")")
    return steps


def global_layer(model: models.Model) -> tuple:
    """The model's global layer as a trace step's layer: its heads and features, no window and no chunk."""
    axes = {k: v for k, v in model.axes().items() if k != "attention_chunk"}
    return tuple(sorted({**axes, "window_left": semantics.NO_WINDOW}.items()))


def layer_steps(model: models.Model, steps: Counter) -> tuple[Counter, dict]:
    """Each model step as its windowed and its global layer, weighted by how many layers of each it has;
    and which kind each layer step is."""
    windowed, global_ = model.windowed_layers, model.num_layers - model.windowed_layers
    out, kind = Counter(), {}
    for step, count in steps.items():
        out[step] += count * windowed
        kind[step] = "window"
        if global_:
            other = traces.Step(step.mode, global_layer(model), step.requests)
            out[other] += count * global_
            kind[other] = "global"
    return out, kind


def request(model_name: str, trace, implementations, backends, out: Path | None, device, resume=False, l2="cold"):
    """The run request of ``swabench price``; UserError (exit 2) before anything runs for bad input."""
    from swabench.inputs import axes
    from swabench.run import replay

    model = preset(model_name)
    _refuse_wrong_paths(implementations)
    implementations = list(implementations) or engine_paths(device)
    steps = trace_steps(model, trace) if trace else template_steps(model)
    layered, kind = layer_steps(model, steps)
    source = f"price-{model.name}" + (f"-{Path(trace).stem}" if trace else "")
    digest = hashlib.sha256(repr(sorted((repr(s), n) for s, n in layered.items())).encode()).hexdigest()
    meta = {"price": {"model": model.name, "windowed_layers": model.windowed_layers, "num_layers": model.num_layers,
                      "model_steps": sum(steps.values()),
                      "layers": {axes.make_case(s.axes()).case_id: kind[s] for s in layered},
                      "kv": kv_bytes(model, steps)}}
    request = replay.steps_request(source, digest, layered, implementations, backends, out, device, resume, l2, meta)
    if device.type == "cpu" and not resume:  # a resume has timed some of it already: the user chose to go on
        _refuse_hours_on_the_cpu(model, trace, request.scenario, device)
    return request


def _refuse_hours_on_the_cpu(model: models.Model, trace, scenario, device) -> None:
    """UserError for steps that would keep even an idle CPU past ``CPU_LIMIT_S``: the refusal is about the work, the
    same whatever else the machine runs now (the run's own estimate, at this machine's pace, is said when it starts)."""
    import torch

    from swabench.run import cpu_cost

    cost = cpu_cost.estimate(scenario.points, device, at=cpu_cost.IDLE)
    work, threads, minutes = cost.multiply_adds, torch.get_num_threads(), cost.seconds / 60
    if minutes * 60 <= CPU_LIMIT_S:
        return
    cases = scenario.cases
    steps = f"{trace}'s steps of {model.name}" if trace else \
        (f"{model.name}'s template steps in models.toml, sized for a GPU (up to {max(c.largest()[1] for c in cases)} "
         f"keys, batches of up to {max(c.batch_size for c in cases)})")
    raise UserError(f"price on the CPU: {steps} need up to {work / 1e12:.1f} T multiply-adds to gate and time "
                    f"({len(cases)} layer steps), about {minutes:.0f} min on {threads} idle CPU threads, past the "
                    f"{CPU_LIMIT_S // 60} min a price may take on the CPU; give a TRACE of shorter steps of "
                    f"{model.name} (the repository's {SMALL_TRACE} is one of gemma-3-27b: `swabench price --model "
                    f"gemma-3-27b {SMALL_TRACE}` takes minutes on a CPU), or run it on a GPU (--device cuda)")


def _refuse_wrong_paths(implementations) -> None:
    """A price weighs correct paths only: a known bug's or a planted mistake's time answers nothing."""
    from swabench.impls import registry

    wrong = [n for n in implementations if n in registry.names() and registry.get(n).expected_to_fail]
    if wrong:
        allowed = [i.name for i in registry.all_implementations() if i.kind == "correct"]
        raise UserError(f"--impl {wrong[0]}: a {registry.get(wrong[0]).kind} path; price weighs correct paths only: "
                        f"{', '.join(allowed)}")


def engine_paths(device) -> list[str]:
    """What a price runs unless told: every correct path an engine serves a layer with that runs on ``device``
    (the naive masks among them), not the known bugs and not the peers; where no library's path runs (no
    GPU), the embedded PyTorch paths stand in for them."""
    from swabench.impls import registry

    correct = [i for i in registry.all_implementations() if i.kind == "correct" and not i.peer]
    served = [i.name for i in correct if i.library != "torch" and not i.availability(device)]
    return served or [i.name for i in correct if i.library == "torch"]


def kv_bytes(model: models.Model, steps: Counter, page_size: int = 16) -> list[dict]:
    """Per model step: the KV bytes a request holds on average, with every page kept, and with the pages wholly
    before every windowed layer's window (or chunk) evicted (a global layer keeps all)."""
    per_key = 2 * model.num_kv_heads * model.head_dim * KV_BYTES  # K and V
    rows = []
    for step, count in steps.items():
        kept = evicted = 0
        for prefix, queries in step.requests:
            kv = prefix + queries
            pages = -(-kv // page_size) * page_size
            start = semantics.trim_start(kv, queries, model.window_left, page_size, model.attention_chunk)
            kept += model.num_layers * pages * per_key
            evicted += ((model.num_layers - model.windowed_layers) * pages + model.windowed_layers * (pages - start)) \
                * per_key
        n = len(step.requests)
        rows.append({"mode": step.mode, "requests": n, "context": sum(p + q for p, q in step.requests) // n,
                     "count": count, "kv_mib_all_pages": kept / n / 2 ** 20,
                     "kv_mib_evicted": evicted / n / 2 ** 20})
    return rows
