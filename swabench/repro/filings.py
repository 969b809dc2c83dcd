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
    ask: str = ""  # what the report asks for: the fix, the docs change, the request
    chain: bool = False
    comment_on: str = ""  # the upstream issue or pull request the report is a comment on


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
        ask="start the CUDA-core decode kernel's chunk at kv_len - window_left - 1, or document that windowed "
            "decode wants use_tensor_cores=True or a table trimmed to the window",
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
              "query's row kv_len - qo_len + i (include/flashinfer/attention/variants.cuh:89)",
        matters="custom_mask (a draft tree) with window_left >= 0 at plan()",
        control="tree-trim-depth", control_said=TREE_TRIM,
        ask="add to window_left's docstring: key j is attended by query row i only if j >= kv_len - qo_len + i - "
            "window_left; with custom_mask (tree attention) the row, not the token's tree depth, sets the window, "
            "so put the window in the mask (the script's control also starts the table at the window's first "
            "page, so as not to read the keys before it)",
    ),
    "tree-sink-mask": Filing(
        title="BatchAttentionWithAttentionSinkWrapper.plan(custom_mask=...) ignores the mask",
        kind="FlashInfer bug",
        fault="the sink wrapper inherits plan(custom_mask=...), and run() takes the custom mask mode "
              "(flashinfer/prefill.py:5112), but its AttentionSink variant never reads a mask "
              "(flashinfer/jit/attention/variants.py:34-36, where DefaultAttention reads it: "
              "include/flashinfer/attention/variants.cuh:80-85): fa2 runs non-causal",
        matters="custom_mask given to the sink wrapper",
        control="sink-window", control_said="the same wrapper planned causal=True, no mask",
        ask="support custom_mask in the sink variant, or raise in plan() when it is given",
        chain=True,
    ),
    "sglang-verify-tree": Filing(
        title="SGLang's EAGLE target verify on an SWA layer: the tree mask out of step past the window",
        kind="SGLang bug",
        fault="flashinfer_backend.py (at 0005834cdb2a), call_begin_forward, passes kv_start_idx for DFlash only: "
              "EAGLE verify's KV, cut to the window, starts at key 0 under a full-prefix mask; sglang#39160, #39287",
        matters="a context past the window",
        control="tree-trim-depth", control_said=TREE_TRIM,
        ask="the control is what sglang#39287 proposes: the table from the window's first page and the window by "
            "depth in the mask",
        comment_on="sglang#39287",
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
