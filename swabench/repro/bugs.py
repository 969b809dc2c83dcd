"""Every bug ``swabench repro --bug`` writes a script for, and the smallest shipped case where each shows.

- each declared upstream bug (``impls.upstream``): the library's own mistake on a correct call;
- each known-bug and planted implementation: a wrong call, named by the implementation;
- the decode cliff, a performance bug: the CUDA-core decode kernel reads every page of its table
  whatever ``window_left`` says, so with the full table it is timed against the same kernel on the
  trimmed table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from swabench.core import gate, workloads
from swabench.impls import fa2_split, registry, upstream
from swabench.inputs import scenarios
from swabench.repro import holistic, script
from swabench.repro.script import Part

# The shipped scenarios searched, in this order: the first that shows a bug gives its smallest case there.
# ``release`` holds every FlashInfer path and known bug where it shows at serving-like windows; ``edges``
# (windows of 0 keys, two-key requests) comes late, since a mistake there may hide inside one key tile.
SEARCHED = ("release", "serving", "chunked", "noncausal", "tree", "evicted", "default", "edges", "shelf")
CLIFF_AMPLIFICATION = 32  # the cliff case reads at least this many times the keys its window needs
CLIFF_THRESHOLD = 3.0


KINDS = ("FlashInfer bug", "FlashInfer docs gap", "performance request", "caller's mistake", "SGLang bug",
         "regression test", "planted")  # whose fault a script shows, as its Fault line says


@dataclass(frozen=True)
class Filing:
    """How a bug is filed: its title in the library's terms, whose mistake it is (``kind``, one of KINDS) and why,
    read at the release's source, the arguments that decide it, and the control that pins the cause: the correct
    path run beside it on the same inputs (``control``, said in the library's terms by ``control_said``), its own
    call planned again with ``keywords``, or one only its script makes.  ``chain``: shown where the draft is a
    chain, so its custom mask is the causal one."""
    title: str
    kind: str
    fault: str
    matters: str = ""
    control: str = ""
    keywords: tuple = ()
    control_said: str = ""
    ask: str = ""  # what the report asks for: the fix, the docs change, the request
    chain: bool = False


@dataclass(frozen=True)
class Bug:
    ref: str
    impl: str  # the path it shows on
    summary: str
    url: str = ""
    twin: str = ""  # a performance bug: the correct path it is timed against
    fixed_in: str | None = None
    filing: Filing | None = None  # how it is filed: title, fault, what matters, control


SINK_WRAPPER = "BatchAttentionWithAttentionSinkWrapper"
PLAN_WINDOW = "the same table planned with window_left at plan()"
TRIM = "the table from the page holding the first query's oldest key, planned with window_left"
TREE_TRIM = "the table from the page holding key kv_len - qo_len - window_left, the window by tree depth in " \
            "custom_mask, no window_left"
FILINGS: dict[str, Filing] = {
    "flashinfer#4972": Filing(
        title="BatchPrefillWithPagedKVCacheWrapper (fa2), causal=False with window_left: rows past a split-KV "
              "chunk are wrong",
        kind="FlashInfer bug",
        fault="fa2's split-KV plan under use_cuda_graph=True with causal=False and a window: flashinfer#4972 "
              "reports it; PR flashinfer#4992 proposes a fix",
        matters="fa2 splits a request along KV by SM count (the rows depend on the GPU), always under "
                "use_cuda_graph=True",
        keywords=(("disable_split_kv", True),),
        ask="until the fix lands, plan(disable_split_kv=True) is right on the same inputs",
    ),
    "holistic-offset": Filing(
        title="BatchAttention reads the wrong K/V rows from pages past 2^32 elements of the cache",
        kind="FlashInfer bug",
        fault="prefetch_offest in include/flashinfer/attention/persistent.cuh:66 computes indices[page_iter] * "
              "kv_stride_page (an int32 index, uint32 strides) in 32 bits and widens it to size_t only when it "
              "stores it, so the offset wraps at 2^32 elements",
        matters="a K or V cache of more than 2^32 elements and a page index past 2^32 / (page_size x num_kv_heads "
                "x head_dim)",
        control_said=holistic.CONTROL,
        ask="widen before the multiply: static_cast<size_t>(... indices[page_iter] ...) * kv_stride_page, as "
            "paged_kv_t::get_elem_offset (include/flashinfer/page.cuh:199) does for the page kernels and as "
            "flashinfer#3136 did for the MLA kernels (issue flashinfer#3130)",
    ),
    "flashinfer#1679": Filing(
        title="BatchAttentionWithAttentionSinkWrapper at a second head_dim in one process runs the first's "
              "module",
        kind="regression test",
        fault="fixed in 0.7.4: the sink wrapper's JIT module was named without its head_dim (flashinfer#1679 is the "
              "pull request that added the wrapper); nothing to file",
        matters="two BatchAttentionWithAttentionSinkWrapper plans at different head_dim in one process",
    ),
    "decode-cliff": Filing(
        title="BatchDecodeWithPagedKVCacheWrapper (CUDA cores) reads every page of its table whatever "
              "window_left says",
        kind="performance request",
        fault="the CUDA-core decode kernel loops over the whole [0, kv_len) and applies the window as a mask on each "
              "score (include/flashinfer/attention/decode.cuh:438-442, 539 and 97-99); its plan is sized on "
              "kv_len (csrc/batch_decode.cu:66-72). The tensor-core path starts at the window "
              "(include/flashinfer/attention/prefill.cuh:4379-4385), as flashinfer#1661 made fa2 prefill do and "
              "flashinfer#4825 the cute-dsl decode",
        matters="use_tensor_cores=False with window_left >= 0 and a page table longer than the window",
        ask="start the CUDA-core decode kernel's chunk at kv_len - window_left - 1, or document that windowed "
            "decode wants use_tensor_cores=True or a table trimmed to the window",
    ),
    "paged-plan-no-window": Filing(
        title="plan() without window_left, then forward(window_left=W): not the window W asks for",
        kind="caller's mistake",
        fault="window_left belongs to plan(): fa2 plans its KV chunks there, and a window given only to the "
              "deprecated forward() runs against chunks planned for the whole table",
        matters="window_left given to forward() instead of plan()",
        control="paged-window", control_said=PLAN_WINDOW,
    ),
    "paged-trim-causal": Filing(
        title="a table trimmed at kv_len - qo_len - W, planned causal without a window: keys before the window",
        kind="caller's mistake",
        fault="a trimmed table still needs window_left at plan(): the first query's window is not the last's",
        matters="the trimmed table with window_left=-1 at plan()",
        control="paged-trim", control_said=TRIM,
    ),
    "batch-attention-trim": Filing(
        title="BatchAttention on a table trimmed to the window: keys before a query's own window",
        kind="caller's mistake",
        fault="BatchAttention's plan() takes no window_left, so a table trimmed to the window's first page is all "
              "a window can be there; it is exact only on decode steps at page size 1",
        matters="the trimmed table, causal=True, and no window_left to give",
        control="paged-trim", control_said=TRIM,
    ),
    "decode-trim-nowindow": Filing(
        title="decode on a table trimmed by kv_start_idx with window_left=-1 sees keys before the window",
        kind="caller's mistake",
        fault="SGLang's FlashInfer decode recipe for SWA layers (kv_start_idx, window_left=-1) is exact only at page "
              "size 1, which is where SGLang runs it; at larger pages the first page's older keys stay in",
        matters="page_size > 1",
        control="decode-trim", control_said="the same trimmed table planned with window_left",
    ),
    "paged-sinks-dropped": Filing(
        title="BatchPrefillWithPagedKVCacheWrapper.run(sinks=...) on fa2 and fa3: the sinks are silently dropped",
        kind="FlashInfer bug",
        fault="run()'s docstring says of sinks \"When provided, the kernel applies the attention-with-sink "
              "variant\" (flashinfer/prefill.py:4744-4748), but the paged run passes them on for trtllm-gen only "
              "(prefill.py:867): fa2 (878-916) and fa3 (919-975) drop them, where cute-dsl and cudnn raise",
        matters="sinks= given to the paged prefill wrapper's run() on fa2 or fa3",
        control="sink-window", control_said=f"{SINK_WRAPPER}, the wrapper that applies sinks",
        ask="raise in run() where the backend does not apply sinks (one line at prefill.py:5244: if sinks is not "
            "None and self._backend != \"trtllm-gen\": raise ValueError(...)), or apply them",
    ),
    "sglang-extend-nomask": Filing(
        title="SGLang's extend before its PR 26513: the unmasked prefix shows keys before the window",
        kind="SGLang bug",
        fault="SGLang's FlashInfer extend path before its PR 26513 (fixed there) planned the cached prefix without "
              "the window mask",
        matters="the prefix planned without the window mask",
        control="sglang-extend", control_said="the same three calls with the prefix's window as its custom_mask",
    ),
    "sglang-extend-ragged-nowindow": Filing(
        title="SGLang's extend at 0005834c: the ragged part shows new tokens before the window",
        kind="SGLang bug",
        fault="SGLang's FlashInfer extend path at 0005834c plans the ragged part without a window and gives it to "
              "run() only",
        matters="window_left at run() only",
        control="sglang-extend", control_said="the same three calls with window_left at the ragged plan()",
    ),
    "eagle-verify-untrimmed": Filing(
        title="EAGLE verify on an SWA layer cuts the KV length without kv_start_idx: the wrong keys",
        kind="SGLang bug",
        fault="SGLang's EAGLE verify on SWA layers cuts the KV length but reads the table from the request's first "
              "key (sglang#22679)",
        matters="the KV length cut without kv_start_idx",
        control="paged-trim", control_said=TRIM,
    ),
    "chunk-as-window": Filing(
        title="a chunk of C planned as window_left = C - 1 reaches into the previous chunk",
        kind="caller's mistake",
        fault="chunked attention is not a sliding window: window_left = C - 1 lets a query see the previous chunk",
        matters="window_left = C - 1 in place of a chunked table",
        control="chunk-trim", control_said="the table trimmed to the query's own chunk, causal, no window",
    ),
    "tree-window-slot": Filing(
        title="window_left with a draft tree as custom_mask: the window counts from the query's row, not its "
              "depth",
        kind="FlashInfer docs gap",
        fault="the kernel measures the window from the query's row kv_len - qo_len + i (include/flashinfer/"
              "attention/variants.cuh:89, prefill.cuh:4379), and window_left's docstring (flashinfer/prefill.py:"
              "3690-3692) does not say so; a tree needs its depth",
        matters="custom_mask (a draft tree) with window_left >= 0 at plan()",
        control="tree-trim-depth", control_said=TREE_TRIM,
        ask="add to window_left's docstring: key j is attended by query row i only if j >= kv_len - qo_len + i - "
            "window_left; with custom_mask (tree attention) the row, not the token's tree depth, sets the window, "
            "so put the window in the mask",
    ),
    "tree-sink-mask": Filing(
        title="BatchAttentionWithAttentionSinkWrapper.plan(custom_mask=...) ignores the mask",
        kind="FlashInfer bug",
        fault="the sink wrapper inherits plan(custom_mask=...) and sets the custom mask mode (flashinfer/prefill.py:"
              "5112), but its AttentionSink variant never reads a mask (flashinfer/jit/attention/variants.py:34-36, "
              "where DefaultAttention reads it: include/flashinfer/attention/variants.cuh:80-85): fa2 runs "
              "non-causal",
        matters="custom_mask given to the sink wrapper",
        control="sink-window", control_said=f"the same {SINK_WRAPPER} planned causal=True with no mask",
        ask="support custom_mask in the sink variant, or raise in plan() when it is given",
        chain=True,
    ),
    "sglang-verify-tree": Filing(
        title="SGLang's EAGLE target verify on an SWA layer: the tree mask out of step past the window",
        kind="SGLang bug",
        fault="SGLang's FlashInfer backend (flashinfer_backend.py at 0005834cdb2a) cuts the KV length to the "
              "window without kv_start_idx and hands FlashInfer the full-prefix tree mask; sglang#39160 and "
              "sglang#39287 report it",
        matters="a context past the window",
        control="tree-trim-depth", control_said=TREE_TRIM,
    ),
    "vllm-tree-window": Filing(
        title="vLLM's tree attention counts the window from a node's slot, not its depth",
        kind="caller's mistake",
        fault="vLLM's tree attention measures the window by slot",
        matters="a draft tree past the window",
        control="torch-trim", control_said="the keys each node's window and ancestors hold, in PyTorch",
    ),
}
PLANTED = Filing("", "planted", "a mistake planted to show the check catches it", control="torch-trim",
                 control_said="the keys each query's window holds, in PyTorch")


def catalogue() -> list[Bug]:
    """Every bug with a script, upstream ones first."""
    def bug(ref, impl, summary, **more) -> Bug:
        filing = FILINGS.get(ref) or dataclasses.replace(PLANTED, title=f"a planted mistake: {summary}")
        return Bug(ref, impl, summary, filing=filing, **more)

    bugs = [bug(b.ref, sorted(b.impls)[0], b.summary, url=b.url, fixed_in=b.fixed_in) for b in upstream.declared()]
    bugs += [bug(i.name, i.name, i.summary) for i in registry.all_implementations()
             if i.expected_to_fail and not script.no_script(i)]
    bugs.append(bug("decode-cliff", "decode-window", "the CUDA-core decode kernel reads every page of the table "
                    "plan() gets, whatever window_left says: with the full table a decode step reads the whole "
                    "context where its window needs the last W + 1 keys", twin="decode-trim"))
    return bugs


def get(ref: str) -> Bug | None:
    return next((b for b in catalogue() if b.ref == ref), None)


def _size(case) -> int:
    qo, kv = workloads.request_lengths(case)
    return sum(q * k for q, k in zip(qo, kv)) * case.num_qo_heads * case.head_dim


def _shows_on_random(impl, case, backend: str) -> bool:
    """Whether the mistake moves the output past the gate's tolerance on random inputs, which is all a
    script checks with: simulated on the CPU by gathering the keys the path sees."""
    from swabench.impls.embedded import as_predicted

    if impl.ignores & case.features:
        return True
    w = workloads.build(case, "cpu")
    errors, tol = gate.run_checked(as_predicted(impl, w, backend), w), gate.TOLERANCES[case.dtype]
    return bool(errors.unwritten) or not errors.rel_l2 <= tol.rel_l2 or not float(errors.row_rel_l2.max()) <= tol.row_rel_l2


def shipped_files() -> list:
    """The shipped scenario files the search reads (never a file of the same name in the working folder)."""
    return [scenarios.shipped_dir() / f"{name}.toml" for name in SEARCHED]


@lru_cache(maxsize=None)
def _shipped(name: str):
    return scenarios.load(scenarios.shipped_dir() / f"{name}.toml").points


def _points(impl: str):
    """The implementation's points that it can run, scenario by scenario in SEARCHED's order, smallest first within
    each."""
    runs = registry.get(impl)
    return [p for name in SEARCHED
            for p in sorted((p for p in _shipped(name) if p.impl == impl and runs.skip_reason(p.case, p.backend, None)
                             is None), key=lambda p: (_size(p.case), p.backend != "fa2"))]


def parts(bug: Bug, num_sms: int = fa2_split.H200_SMS) -> tuple[list[Part], str]:
    """The script's parts on the first shipped case where ``bug`` shows (SEARCHED's order, smallest first), and
    where that is in words."""
    impl = registry.get(bug.impl)
    points = _points(bug.impl)
    if bug.twin:
        def wide(p):
            qo, kv = workloads.request_lengths(p.case)
            need = sum(min(k, p.case.window_left + q) for q, k in zip(qo, kv))
            return p.backend == "fa2" and sum(kv) >= CLIFF_AMPLIFICATION * need
        # the smallest such case of any scenario: the cliff shows wherever the table outgrows the window, and a
        # script builds its case on the CPU too
        p = min((p for p in points if wide(p)), key=lambda p: _size(p.case))
        return ([Part(p.case, bug.impl, p.backend, "timed", says="the full page table"),
                 Part(p.case, bug.twin, p.backend, "timed", "_twin", says="the table trimmed to the window")],
                f"{p.case.label}: {sum(workloads.request_lengths(p.case)[1])} keys in the table")
    if bug.ref == "flashinfer#1679":
        p = next(p for p in points if p.backend == "fa2")
        other = 128 if p.case.head_dim == 64 else 64
        first = dataclasses.replace(p.case, head_dim=other)
        return ([Part(first, bug.impl, p.backend, "first", "_first"), Part(p.case, bug.impl, p.backend)],
                f"{p.case.label}, run after the same wrapper at head_dim {other} in one process")
    if bug.ref == holistic.REF:
        for p in points:
            own = impl.must_fail(p.case, *workloads.request_lengths(p.case), p.backend)
            speaks = upstream.speaks(bug.impl, p.case, p.backend, own)
            if speaks and speaks.ref == bug.ref:
                return holistic.parts(p.case), holistic.where(p.case)
        raise LookupError(f"no shipped case shows {bug.ref}")
    if bug.ref == "flashinfer#4972":
        for p in points:
            noncausal = p.backend == "fa2" and not p.case.causal and p.case.window_left >= 0 and p.case.mode != "decode"
            rows = upstream.fa2_noncausal_wrong_rows(bug.impl, p.case, num_sms) if noncausal else []
            if any(len(r) for r in rows):
                wrong = ", ".join(f"request {b}: rows {r.start}-{r.stop - 1}" for b, r in enumerate(rows) if len(r))
                return ([Part(p.case, bug.impl, p.backend), *control(bug, p)],
                        f"{p.case.label} on {num_sms} SMs ({wrong})")
        raise LookupError(f"no shipped case shows {bug.ref} on {num_sms} SMs")
    for p in points:
        qo, kv = workloads.request_lengths(p.case)
        if bug.filing.chain and p.case.tree != "chain":
            continue
        if impl.must_fail(p.case, qo, kv, p.backend) and _shows_on_random(impl, p.case, p.backend):
            return [Part(p.case, bug.impl, p.backend), *control(bug, p)], p.case.label
    raise LookupError(f"no shipped case shows {bug.ref} on random inputs")


def control(bug: Bug, point) -> list[Part]:
    """The control beside the bug's call on the same inputs: its own path planned with the control's keywords, or
    the correct path on the first backend it runs the case on; none where the bug names no control or its path
    cannot run the case."""
    filing = bug.filing
    if filing.keywords:
        said = ", ".join(f"{k}={v!r}" for k, v in filing.keywords)
        return [Part(point.case, bug.impl, point.backend, "control", "_control", f"the same plan with {said}",
                     filing.keywords)]
    if not filing.control:
        return []
    impl = registry.get(filing.control)
    runs = [b for b in impl.runs_on(list(dict.fromkeys([point.backend, *impl.backends])))
            if impl.skip_reason(point.case, b, None) is None]
    return [Part(point.case, filing.control, runs[0], "control", "_control",
                 filing.control_said or f"{filing.control} ({impl.summary})")] if runs else []


def shows(bug: Bug, parts: list[Part]) -> bool:
    """Whether the bug shows on the parts' checked case: a known mistake as the suite models it, on random inputs;
    an upstream bug on a correct path (#1679) shows in the library, not in a model, so it is taken as it is."""
    p = next(p for p in parts if p.role == "checked")
    impl = registry.get(p.impl)
    if not impl.expected_to_fail:
        return True
    qo, kv = workloads.request_lengths(p.case)
    return bool(impl.must_fail(p.case, qo, kv, p.backend)) and _shows_on_random(impl, p.case, p.backend)


def rows_off(part: Part) -> str:
    """How the part's first request sees the wrong keys as the suite models the path: per run of queries, how many
    keys outside the exact mask it sees (or of it misses), as 'queries 0-126 see 13 + i keys outside its mask,
    queries 127-399 see 140 ...'; '' for a correct path or one that ignores a feature of the case."""
    from swabench.core import semantics, trees

    impl, case = registry.get(part.impl), part.case
    if impl.kind == "correct" or impl.ignores & case.features:
        return ""
    qo_lens, kv_lens = workloads.request_lengths(case)  # the whole batch: it sizes the kernel's tiles and chunks
    qo, kv = qo_lens[0], kv_lens[0]
    tree = (trees.of_case(case) or [None])[0]
    garbled = impl.garbled_rows(case, qo_lens, kv_lens, part.backend)[0]
    if garbled.any():
        rows = garbled.nonzero().flatten().tolist()
        return (f"request 0: queries {rows[0]}-{rows[-1]} take other rows' partial outputs (plan() split the request "
                f"into more KV chunks than the window needs, and the merge reads them out of step)")
    exact = semantics.of_case(case).mask(qo, kv, tree=tree)
    got = impl.seen_masks(case, qo_lens, kv_lens, part.backend)[0] if impl.seen else \
        impl.computes(case, kv - qo).mask(qo, kv, tree=tree)
    said = [_runs((got & ~exact).sum(dim=1).tolist(), ("sees", "see"), "outside its mask"),
            _runs((exact & ~got).sum(dim=1).tolist(), ("misses", "miss"), "of its mask")]
    return "request 0: " + "; ".join(s for s in said if s) if any(said) else ""


def _runs(counts: list[int], verbs: tuple[str, str], where: str, most: int = 4) -> str:
    """'queries 0-126 see 13 + i keys outside its mask, queries 127-399 see 140': ``counts`` per query as runs of a
    constant or a step of one, at most ``most`` of them (then the largest count); ``verbs``: (one, several)."""
    runs, i = [], 0
    while i < len(counts):
        step = counts[i + 1] - counts[i] if i + 1 < len(counts) and abs(counts[i + 1] - counts[i]) <= 1 else 0
        j = i
        while j + 1 < len(counts) and counts[j + 1] - counts[j] == step:
            j += 1
        runs.append((i, j, counts[i], step))
        i = j + 1
    runs = [r for r in runs if r[2] or r[3]]
    if not runs:
        return ""
    if len(runs) > most:
        return f"{len([c for c in counts if c])} queries {verbs[1]} up to {max(counts)} keys {where}"

    def amount(first, start, step):
        base = first - start * step
        return str(first) if not step else ("i" if not base else f"{base} {'+' if step > 0 else '-'} i")

    return ", ".join((f"queries {a}-{b} {verbs[1]}" if b > a else f"query {a} {verbs[0]}") +
                     f" {amount(first, a, step)} keys {where}" for a, b, first, step in runs)
