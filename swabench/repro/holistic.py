"""The script for ``holistic-offset``: BatchAttention reading pages past 2^32 elements of its cache.

Its case needs more than 8 GiB a side of K/V, which a trace would build on the CPU, so the script is written from
the template below rather than traced; ``check`` still holds its calls, plan() and run() argument by argument, to
the suite's ``batch-attention-trim`` on a small case of the same step.  The control is the same call on a copy of
the same pages numbered from 0: the same keys and the same kernel, every offset below 2^32.
"""

from __future__ import annotations

import dataclasses

from swabench.impls import batch_attention
from swabench.impls.flashinfer_workspace import MIB, OVERFLOW, WORKSPACE_BYTES, WORKSPACE_CAP
from swabench.repro import kit, script, verify
from swabench.repro.script import Part
from swabench.repro.source import call, literal

REF = "holistic-offset"
CONTROL = "the same call on a copy of the trimmed pages numbered from 0 (every offset below 2^32 elements)"
CALL = ("Call: flashinfer.BatchAttention(kv_layout='NHD'), its float_workspace_buffer grown until plan() fits, "
        "then plan(qo_indptr, kv_indptr, kv_indices, kv_lens, ..., causal=True) on each request's table trimmed to "
        "its window, run(q, (k_cache, v_cache), out=, lse=)")

MAIN = '''
def main():
    dev = torch.device(DEVICE)
    env = environment()  # before any call: a crash can take the CUDA context with it
    x = make_inputs(CASE, dev)
    q, k_cache, v_cache = x["q"], x["k_cache"], x["v_cache"]
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2], dtype=torch.float32, device=dev)
    # each request's table from the page that holds its oldest visible key (page size 1: exactly its window)
    ps, window = CASE["page_size"], CASE["window_left"]
    starts = [max(0, k - n - window) // ps * ps for n, k in zip(CASE["qo_lens"], CASE["kv_lens"])]
    kv_indptr, kv_indices, _ = table_slice(CASE, x, starts, CASE["kv_lens"])
    kv_lens = torch.tensor([k - s for k, s in zip(CASE["kv_lens"], starts)], dtype=torch.int32)
    stride = ps * CASE["num_kv_heads"] * CASE["head_dim"]  # elements a page holds, K's and V's alike
    last_page = [int(kv_indices[kv_indptr[b]:kv_indptr[b + 1]].max()) for b in range(len(starts))]
    past = [b for b, page in enumerate(last_page) if (page + 1) * stride > 2**32]
    holistic = flashinfer.BatchAttention(kv_layout="NHD", device=dev)

    def plan(indices):
        plan_grown(holistic, dev, x["qo_indptr"], kv_indptr, indices.to(device=dev), kv_lens, CASE["num_qo_heads"],
                   CASE["num_kv_heads"], CASE["head_dim"], CASE["head_dim"], ps, causal=True,
                   sm_scale=CASE["sm_scale"], logits_soft_cap=None, q_data_type=DTYPE, kv_data_type=DTYPE)

    plan(kv_indices)

    def step():
        holistic.run(q, (k_cache, v_cache), out=out, lse=lse, logits_soft_cap=0.0)

    wrong, what, detail = outcome(CASE, x, step, out, TOLERANCE)
    verdict = "NOT REPRODUCED" if not wrong else "REPRODUCED (crash)" if what.startswith("crash") else "REPRODUCED"
    print(f"{verdict}: {what}", *detail, f"requests {past} read a page that ends past 2^32 elements", sep="\\n")
    # Control: the same pages copied out and numbered from 0, so every offset stays below 2^32
    used = kv_indices.to(device=dev, dtype=torch.int64)
    k_small, v_small = k_cache[used], v_cache[used]
    plan(torch.arange(len(used), dtype=torch.int32))

    def step_control():
        holistic.run(q, (k_small, v_small), out=out, lse=lse, logits_soft_cap=0.0)

    print(f"CONTROL, {CONTROL}: " + outcome(CASE, x, step_control, out, TOLERANCE)[1])
    print(*env, sep="\\n")
    return 1 if wrong else 0


def plan_grown(wrapper, dev, *args, **kwargs):
    """plan() in a float workspace that holds its partial outputs: BatchAttention allocates 384 MiB and its
    planner reserves them by SM count and KV heads (622 MB on an H200 at 16 KV heads), so grow it on overflow."""
    size = WORKSPACE
    while True:
        wrapper.float_workspace_buffer = torch.empty((size,), dtype=torch.uint8, device=dev)
        try:
            return wrapper.plan(*args, **kwargs)
        except RuntimeError as e:
            if OVERFLOW not in str(e) or size >= CAP:
                raise
            size *= 2
'''


def parts(case) -> list[Part]:
    """The suite's side of the script: its checked call (the control renumbers pages, which no suite path does)."""
    return [Part(case, "batch-attention-trim", "fa2")]


def render(case, header: script.Header) -> str:
    """The script's text for ``case`` under ``header``."""
    literals = script.case_literals(case)
    helpers = script.needed_helpers([kit.make_inputs, kit.table_slice, kit.seen, kit.reference, kit.outcome,
                                     kit.wrong_rows, kit.environment], MAIN, literals)
    read = script.case_keys(MAIN, helpers)
    constants = [call("CASE = dict", [], {k: literal(v) for k, v in literals.items() if k in read}),
                 script.tolerance_line(case.dtype), f"DTYPE = torch.{case.dtype}",
                 f"WORKSPACE, CAP = {WORKSPACE_BYTES // MIB} * 2**20, {WORKSPACE_CAP // MIB} * 2**20  # float "
                 f"workspace bytes: the first tried, the most",
                 f"OVERFLOW = {OVERFLOW!r}  # what plan() says when its workspace is too small",
                 f"CONTROL = {CONTROL!r}", 'DEVICE = "cuda"']
    return script.assemble(header, [CALL, script.shape_line(literals)], ["import torch", "", "import flashinfer"],
                           constants, MAIN.strip(), helpers)


def small(case):
    """A case of the same step small enough to trace on the CPU: four requests, a prefix of a few windows."""
    return dataclasses.replace(case, batch_size=4, prefix_len=3 * (case.window_left + 1) + 5)


def check(given: list[Part], header: script.Header) -> None:
    """Drift where the template's calls on a small case of the same step are not the suite's: its checked call
    must be the suite's call for call, and its control the same plan() on the same table numbered from 0."""
    little = small(given[0].case)
    want, _ = verify.suite_calls(parts(little))
    got, _ = verify.script_calls(render(little, header))
    control, checked = got[len(want):], got[:len(want)]
    verify.same_calls(want, checked)
    planned = [c for c in checked if c[1] == "plan"]
    replanned = [c for c in control if c[1] == "plan"]
    if len(planned) != 1 or len(replanned) != 1 or not _renumbered(planned[0], replanned[0]):
        raise verify.Drift("the control is not the checked plan() on its pages numbered from 0")


def _renumbered(plan, again) -> bool:
    """Whether ``again`` is ``plan`` with its kv_indices (the third argument) replaced by 0, 1, 2, ..."""
    (_, _, args, kwargs), (_, _, args2, kwargs2) = plan, again
    indices = args2[2]
    return verify.same(kwargs, kwargs2) and all(verify.same(a, b) for i, (a, b) in enumerate(zip(args, args2))
                                                if i != 2) and indices[3] is not None and \
        indices[3].tolist() == list(range(len(args[2][3])))


def where(case) -> str:
    """The case and the requests that read past 2^32 elements, in words."""
    wrapped = batch_attention.wrapped_requests(case)
    return f"{case.label}: requests {', '.join(map(str, wrapped))} read a page that ends past 2^32 elements"
