"""A step of a trace as FlashInfer-Bench's records (docs/flashinfer-bench.md): the Definition of its layer type and
stage (the window in its name, a const axis and its reference), its Workload's inputs, the index tensors its blob
stores and the metadata that gives the step back (``fib.export`` writes them, ``fib_import`` reads them)."""

from __future__ import annotations

import uuid
from dataclasses import asdict

from swabench.analysis.replay import layer_label
from swabench.inputs import axes
from swabench.inputs.fib_reference import STAGES, reference

OP_TYPE = "gqa_paged"
DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "float8_e4m3": "float8_e4m3fn"}
NAMESPACE = uuid.UUID("6f1c1f0e-5b0a-4c38-9d7e-7a4f2f1e9b10")  # workload uuids: the same step, the same uuid


def workload_uuid(case) -> str:
    """A step's workload uuid: the same step of the same layer gets the same one at every export."""
    return str(uuid.uuid5(NAMESPACE, f"{name(case)}/{case.case_id}"))


def name(case) -> str:
    """The definition's name: its stage and window first, so no one takes it for a causal definition."""
    cap = f"_cap{case.logits_soft_cap:g}".replace(".", "p") if case.logits_soft_cap else ""
    return (f"gqa_paged_{STAGES[case.mode]}_swa_w{case.window_left}_h{case.num_qo_heads}_kv{case.num_kv_heads}"
            f"_d{case.head_dim}_ps{case.page_size}" + ("_sinks" if case.sinks else "") + cap
            + ("" if case.dtype == "bfloat16" else f"_{case.dtype}") + (f"_kv_{case.kv_dtype}" if case.kv_dtype else ""))


def definition(case, source: str = "") -> dict:
    """The Definition of ``case``'s layer type and stage (FlashInfer-Bench's field names and axes, plus the
    window as a const axis), as a JSON document."""
    decode = case.mode == "decode"
    rows = "batch_size" if decode else "total_q"
    dtype, kv = DTYPES[case.dtype], DTYPES[case.cache_dtype]
    const = {"num_qo_heads": case.num_qo_heads, "num_kv_heads": case.num_kv_heads, "head_dim": case.head_dim,
             "page_size": case.page_size, "window_left": case.window_left}
    var = {"batch_size": "Requests in the batch.", "num_pages": "Pages of the KV cache.",
           "len_indptr": "Length of the indptr arrays (batch_size + 1).",
           "num_kv_indices": "Total number of KV page indices."}
    if not decode:
        var["total_q"] = "Total number of query tokens."
    axes_doc = {k: {"type": "const", "value": v} for k, v in const.items()}
    axes_doc["window_left"]["description"] = (f"A query at position p sees keys p - {case.window_left} .. p "
                                              f"(FlashInfer's window_left; sliding_window {case.window_left + 1}).")
    axes_doc.update({k: {"type": "var", "description": v} for k, v in var.items()})
    cache = {"shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"], "dtype": kv}
    inputs = {"q": {"shape": [rows, "num_qo_heads", "head_dim"], "dtype": dtype},
              "k_cache": {**cache, "description": "Paged key cache (NHD)."},
              "v_cache": {**cache, "description": "Paged value cache (NHD)."}}
    if not decode:
        inputs["qo_indptr"] = {"shape": ["len_indptr"], "dtype": "int32", "description": "Query offsets per request."}
    inputs.update({
        "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32", "description": "KV page offsets per request."},
        "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32", "description": "Page ids of the KV cache."},
        "kv_last_page_len": {"shape": ["batch_size"], "dtype": "int32",
                             "description": "Valid tokens in each request's last page."},
        "sm_scale": {"shape": None, "dtype": "float32", "description": "Softmax scale, applied before the soft-cap."}})
    if case.sinks:
        inputs["sinks"] = {"shape": ["num_qo_heads"], "dtype": "float32",
                           "description": "Each head's sink logit: one more term of every softmax denominator, "
                                          "with no value."}
    lse = "The base-2 log-sum-exp of the attention logits" + (" and the sink" if case.sinks else "") + "."
    features = "".join([", with one learned sink logit per head in every softmax denominator" * case.sinks,
                        f", logits soft-capped at {case.logits_soft_cap:g} (cap * tanh(logits / cap))"
                        * bool(case.logits_soft_cap)])
    constraints = ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"]
    if not decode:
        constraints.insert(1, "total_q == qo_indptr[-1].item()")
    return {
        "name": name(case), "op_type": OP_TYPE,
        "description": f"Sliding-window grouped query attention, {STAGES[case.mode]}, over a paged KV cache "
                       f"(page_size={case.page_size}): causal and bottom-right aligned, a query at position p "
                       f"sees keys p - {case.window_left} .. p{features}. Layer {layer_label(asdict(case))}; "
                       f"exported by swabench" + (f" from {source}" if source else "") + ".",
        "tags": [f"stage:{STAGES[case.mode]}", f"window_left:{case.window_left}", "source:swabench"],
        "axes": axes_doc, "constraints": constraints, "inputs": inputs,
        "outputs": {"output": {"shape": [rows, "num_qo_heads", "head_dim"], "dtype": dtype},
                    "lse": {"shape": [rows, "num_qo_heads"], "dtype": "float32", "description": lse}},
        "reference": reference(case)}


def index_tensors(case) -> tuple[dict, dict]:
    """The step's stored inputs (int32 index tensors, from ``core.workloads.page_table``) and its var axes."""
    import torch

    from swabench.core import workloads

    qo, kv = workloads.request_lengths(case)
    kv_indptr, kv_indices, last, _, num_pages = workloads.page_table(case, qo, kv)
    tensors = {"kv_indptr": kv_indptr.to(torch.int32), "kv_indices": kv_indices.to(torch.int32),
               "kv_last_page_len": torch.tensor(last, dtype=torch.int32)}
    var = {"batch_size": len(qo), "num_pages": num_pages, "len_indptr": len(qo) + 1,
           "num_kv_indices": len(kv_indices)}
    if case.mode != "decode":
        tensors["qo_indptr"] = torch.cumsum(torch.tensor([0, *qo]), 0).to(torch.int32)
        var["total_q"] = sum(qo)
    return tensors, var


def workload_inputs(doc: dict, case, blob: str) -> dict:
    stored = {"qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"}
    return {k: {"type": "safetensors", "path": blob, "tensor_key": k} if k in stored else
            {"type": "scalar", "value": case.scale} if k == "sm_scale" else {"type": "random"}
            for k in doc["inputs"]}


def step_meta(case, count: int) -> dict:
    meta = {"count": count, "mode": case.mode}
    if case.page_layout != axes.DEFAULTS["page_layout"]:
        meta["page_layout"] = case.page_layout
    if case.seed != axes.DEFAULTS["seed"]:
        meta["seed"] = case.seed
    if case.wrapper_mode != axes.DEFAULTS["wrapper_mode"]:
        meta["wrapper_mode"] = case.wrapper_mode
    return meta
