"""How each bug is filed: its title in the library's terms, whose fault it is as the release's own source shows,
what decides it, the control that pins the cause, and what a report asks for (``bugs`` finds where each shows)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from swabench.repro import holistic


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
    ask: str = ""  # what would close it: the fix, the docs change, the request
    chain: bool = False
    comment_on: str = ""  # the upstream issue or pull request the report is a comment on
    workaround: str = ""  # what a reader can do today, on the releases out now
    origin: str = ""  # the release it first appears in and the change that brought it, read in the history
    affected: str = ""  # who reaches the call: the callers, models and flags
    note: str = ""  # what a reader of the script or of a proposed fix should also know


# the release whose wheel the faults' files and lines were read in (a test holds each cited line to what it says)
SOURCE_RELEASE = "0.7.4"
# a file and a line or range, in full: every citation is written so, so that a test can read each one
CITES = re.compile(r"\b((?:include|csrc|flashinfer)/[\w/.]+\.(?:cuh|cu|py|h)):(\d+)(?:-(\d+))?")
LIBRARY_KINDS = ("FlashInfer bug", "FlashInfer docs gap", "performance request")  # read at FlashInfer's own source

SINK_WRAPPER = "BatchAttentionWithAttentionSinkWrapper"
PLAN_WINDOW = "the same table, window_left at plan()"
TRIM = "the table from the page of the first query's oldest key, window_left at plan()"
TREE_TRIM = "the window by tree depth in custom_mask, the table from the window's first page, no window_left"
FILINGS: dict[str, Filing] = {
    "flashinfer#4972": Filing(
        title="BatchPrefillWithPagedKVCacheWrapper (fa2), causal=False, window_left: split-KV tiles miss keys past "
              "their chunks",
        kind="FlashInfer bug",
        fault="fa2's split-KV plan under use_cuda_graph=True with causal=False and a window: flashinfer#4972 "
              "reports it; PR flashinfer#4992 proposes a fix",
        matters="fa2 splits a request along KV by SM count (the rows depend on the GPU), always under "
                "use_cuda_graph=True",
        keywords=(("disable_split_kv", True),),
        ask="flashinfer#4992 (open), which covers each tile's whole KV span under split-KV: this script is its check",
        workaround="plan(disable_split_kv=True), which keeps each request in one KV chunk, is right on the same "
                   "inputs (the control)",
        origin="FlashInfer 0.4.0: flashinfer#1661 sized fa2's split-KV chunks by the window (the effective KV length "
               "of PrefillSplitQOKVIndptr in scheduler.cuh)",
        note="the patch checked below is written from flashinfer#4992's description, not its diff: it widens "
             "every windowed plan's span, causal ones too, and leaves as it is the rule by which "
             "BatchPODWithPagedKVCacheWrapper sizes its prefill's KV chunks "
             "(include/flashinfer/attention/pod.cuh:354-376)",
    ),
    "holistic-offset": Filing(
        title="BatchAttention reads the wrong K/V rows from pages past 2^32 elements of the cache",
        kind="FlashInfer bug",
        fault="prefetch_offest in include/flashinfer/attention/persistent.cuh:66 computes indices[page_iter] * "
              "kv_stride_page (an int32 index, uint32 strides) in 32 bits and widens it to size_t only when it "
              "stores it, so the offset wraps at 2^32 elements",
        matters="a page that reaches past element 2^32 of its K or V cache: page indices from about 2^32 / "
                "kv_stride_page on (page_size x num_kv_heads x head_dim for a contiguous cache; a larger page stride, "
                "as with K and V interleaved in one tensor, wraps at a smaller index)",
        control_said=holistic.CONTROL,
        ask="widen before the multiply: static_cast<size_t>(... indices[page_iter] ...) * kv_stride_page, as "
            "paged_kv_t::get_elem_offset (include/flashinfer/page.cuh:199) does for the page kernels and as "
            "flashinfer#3136 did for the MLA kernels (issue flashinfer#3130)",
        workaround="keep every page index below 2^32 / kv_stride_page (a K and a V tensor of less than 2^32 "
                   "elements each, e.g. one per layer), or run the layer on BatchPrefillWithPagedKVCacheWrapper, "
                   "whose page offsets are size_t",
        origin="FlashInfer 0.2.7: flashinfer#1137 brought BatchAttention with this product in prefetch_offest "
               "(persistent.cuh)",
    ),
    "flashinfer#1679": Filing(
        title="BatchAttentionWithAttentionSinkWrapper at a second head_dim in one process runs the first's "
              "module",
        kind="regression test",
        fault="fixed in 0.7.4, which names the sink wrapper's JIT module with its head_dim; nothing to file",
        matters="two BatchAttentionWithAttentionSinkWrapper plans at different head_dim in one process",
    ),
    "decode-cliff": Filing(
        title="BatchDecodeWithPagedKVCacheWrapper on CUDA cores reads every page of its table whatever window_left "
              "says",
        kind="performance request",
        fault="the CUDA-core decode kernel walks all of [0, kv_len) (include/flashinfer/attention/decode.cuh:438-442, "
              "include/flashinfer/attention/decode.cuh:539) and masks each score outside the window "
              "(include/flashinfer/attention/decode.cuh:97-99); the tensor-core path starts at the window "
              "(include/flashinfer/attention/prefill.cuh:4379), as flashinfer#4825 made cute-dsl's decode do",
        matters="use_tensor_cores=False with window_left >= 0 and a page table longer than the window",
        ask="start the CUDA-core kernel's chunk at kv_len - window_left - 1 and size DecodePlan's splits by the window "
            "(include/flashinfer/attention/scheduler.cuh:512-517 takes none), or document that windowed decode "
            "wants use_tensor_cores=True or a trimmed table",
        workaround="build the wrapper with use_tensor_cores=True, or hand plan() each request's table trimmed to the "
                   "window (the script's second call)",
        origin="FlashInfer 0.1.2: flashinfer#406 brought window_left to the CUDA-core decode as a mask on the whole "
               "walk",
        affected="a caller that decodes on CUDA cores (use_tensor_cores=False, the default: "
                 "flashinfer/decode.py:1426) with whole tables and window_left: vLLM's FlashInfer backend for GQA "
                 "groups up to 4 (Gemma 2 and 3) until vllm#23214; SGLang trims its tables",
    ),
    "paged-plan-no-window": Filing(
        title="plan() without window_left, then forward(window_left=W): not the window W asks for",
        kind="caller's mistake",
        fault="window_left belongs to plan(), which builds the kernel with the window mask only where window_left "
              ">= 0 (flashinfer/prefill.py:4263); a window given only to the deprecated forward() then moves each fa2 "
              "query tile's first key, so the tile's later queries see keys before their window",
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
        fault="SGLang's FlashInfer decode on SWA layers (kv_start_idx, window_left=-1) is exact only at page "
              "size 1, which is where SGLang runs it; at larger pages the first page's older keys stay in",
        matters="page_size > 1",
        control="decode-trim", control_said="the same trimmed table, window_left at plan()",
    ),
    "paged-sinks-dropped": Filing(
        title="BatchPrefillWithPagedKVCacheWrapper.run(sinks=...) on fa2 and fa3: the sinks are silently dropped",
        kind="FlashInfer bug",
        fault="run()'s docstring says of sinks \"When provided, the kernel applies the attention-with-sink "
              "variant\" (flashinfer/prefill.py:4744-4748), but the paged run passes them on for trtllm-gen only "
              "(flashinfer/prefill.py:867): fa2 (flashinfer/prefill.py:878-918) and fa3 "
              "(flashinfer/prefill.py:919-975) drop them, where cute-dsl and cudnn raise",
        matters="sinks= given to the paged prefill wrapper's run() on fa2 or fa3",
        control="sink-window", control_said=f"{SINK_WRAPPER} (it applies sinks)",
        ask="raise in run() where the backend does not apply sinks (one line at flashinfer/prefill.py:5244: if "
            "sinks is not None and self._backend != \"trtllm-gen\": raise ValueError(...)), or apply them",
        workaround=f"use {SINK_WRAPPER}, which applies the sinks on fa2 and fa3 (the control), as vllm#52148 did",
        origin="FlashInfer 0.2.10: flashinfer#1389 added run(sinks=), passed on for trtllm-gen only; 0.6.13: "
               "flashinfer#3441 wrote the docstring that says the kernel applies them",
        affected="vLLM's FlashInfer prefill on SM12x until vllm#52148 moved it to the sink wrapper: gpt-oss-20b "
                 "scored 0.000 on GSM8K there (0.875 after)",
    ),
    "sglang-extend-nomask": Filing(
        title="SGLang's extend before sglang#26513: the unmasked prefix shows keys before the window",
        kind="SGLang bug",
        fault="fixed by sglang#26513: its FlashInfer extend path planned the cached prefix without the window mask",
        matters="the prefix planned without the window mask",
        control="sglang-extend", control_said="the same calls with the window as the prefix's custom_mask",
    ),
    "sglang-extend-ragged-nowindow": Filing(
        title="SGLang's extend at 0005834c: the ragged part shows new tokens before the window",
        kind="SGLang bug",
        fault="at 0005834c its ragged part is planned without window_left, given to forward_return_lse() alone",
        matters="window_left at run() only",
        control="sglang-extend", control_said="the same calls with window_left at the ragged plan()",
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
        control="chunk-trim", control_said="the table trimmed to the query's own chunk, no window",
    ),
    "tree-window-slot": Filing(
        title="window_left with a draft tree as custom_mask: the window counts from the query's row, not its "
              "depth",
        kind="FlashInfer docs gap",
        fault="window_left's docstring (flashinfer/prefill.py:3690) does not say that the window counts from the "
              "query's row kv_len - qo_len + i (include/flashinfer/attention/variants.cuh:89), with a custom mask too",
        matters="custom_mask (a draft tree) with window_left >= 0 at plan()",
        control="tree-trim-depth", control_said=TREE_TRIM,
        ask="add to window_left's docstring: query row i attends key j only if j >= kv_len - qo_len + i - "
            "window_left, with custom_mask too, and the same rule sets each query tile's first key "
            "(include/flashinfer/attention/prefill.cuh:4379) even where plan() compiled the window out; so with a tree "
            "mask, pass window_left=-1 and put the window, by depth, in the mask",
        workaround="window_left=-1 with the window by depth in the mask, the table from the window's first page "
                   "(the control)",
        origin="FlashInfer 0.1.2: flashinfer#406 anchored the window at the row under a custom mask; 0.4.0: "
               "flashinfer#1661 set each tile's first key by the same rule",
        affected="tree verifiers who read the window as the node's depth (SGLang's EAGLE verify: sglang#39287, "
                 "sglang#35208)",
    ),
    "tree-sink-mask": Filing(
        title="BatchAttentionWithAttentionSinkWrapper.plan(custom_mask=...) ignores the mask",
        kind="FlashInfer bug",
        fault="the sink wrapper's __init__ takes custom_mask_buf and mask_indptr_buf "
              "(flashinfer/attention/_core.py:418-419) and feeds use_custom_mask into backend selection "
              "(flashinfer/attention/_core.py:478, flashinfer/attention/_core.py:517), and run() takes the custom "
              "mask mode (flashinfer/prefill.py:5112), but its AttentionSink variant never reads a mask "
              "(flashinfer/jit/attention/variants.py:34-36, where DefaultAttention reads it: "
              "include/flashinfer/attention/variants.cuh:80-85): fa2 runs non-causal",
        matters="custom_mask given to the sink wrapper",
        control="sink-window", control_said="the same wrapper planned causal=True, no mask",
        ask="support custom_mask in the sink variant, or raise in plan() when it is given",
        chain=True,
        workaround="none in one call for a tree; a chain can plan causal=True with no mask (the control); a tree "
                   "can run as one request per node, its window then its ancestors as one-token pages, planned "
                   "causal=True",
        origin="FlashInfer 0.4.0: flashinfer#1679 added the wrapper, taking custom_mask_buf, over a variant whose "
               "mask is the window alone",
        affected="any caller that hands this wrapper a mask, such as a draft tree verified on a model with sinks "
                 "(GPT-OSS): the mask is taken without a word",
        note="with the mask read (the patch checked below), the window still counts from the query's row, as in every "
             "FlashInfer wrapper (tree-window-slot): on a tree, not a chain, past the window a caller still passes "
             "window_left=-1 and puts the window, by depth, in the mask",
    ),
    "sglang-verify-tree": Filing(
        title="SGLang's EAGLE target verify on an SWA layer: the tree mask out of step past the window",
        kind="SGLang bug",
        fault="flashinfer_backend.py (at 0005834cdb2a), call_begin_forward, passes kv_start_idx for DFlash only: "
              "EAGLE verify's KV, cut to the window, starts at key 0 under a full-prefix mask; sglang#39160, #39287",
        matters="a context past the window",
        control="tree-trim-depth", control_said=TREE_TRIM,
        ask="sglang#39287: the table from the window's first page and the window by depth in the mask, as the "
            "control does",
        comment_on="sglang#39287",
        workaround="serve with --attention-backend fa3, whose verify gives each node its own window "
                   "(_init_sliding_window_attn_spec_metadata), or no speculative decoding on SWA models",
        origin="not confirmed in SGLang's releases; at 0005834cdb2a call_begin_forward passes kv_start_idx for "
               "DFlash alone (sglang#27469); reported in sglang#22679",
        affected="SGLang builds the SWA wrapper pair whenever sliding_window_size is set (Gemma 2 and 3, hybrid-SWA "
                 "configs): EAGLE, EAGLE3 and MTP with --attention-backend flashinfer, past the window",
        note="the script sets the private _window_left as forward(window_left=127) does (flashinfer/prefill.py:4603); "
             "run(window_left=127) fails plan()'s check (flashinfer/prefill.py:4987). For the PR: forward()'s "
             "window_left still moves each query tile's first key by row "
             "(include/flashinfer/attention/prefill.cuh:4379), so give the SWA verify wrapper window_left=-1",
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
