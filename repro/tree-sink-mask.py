#!/usr/bin/env python3
"""BatchAttentionWithAttentionSinkWrapper.plan(custom_mask=...) ignores the mask

Call: BatchAttentionWithAttentionSinkWrapper(backend='fa2', window_left=-1), then plan(causal=False, window_left=-1,
    custom_mask=...), run()
Shape: batch 1; qo_len 7; kv_len 71; 64 query, 8 KV heads; head_dim 64; page_size 1; sinks; bfloat16
Fault: FlashInfer bug: the sink wrapper's __init__ takes custom_mask_buf and mask_indptr_buf
    (flashinfer/attention/_core.py:418-419) and feeds use_custom_mask into backend selection
    (flashinfer/attention/_core.py:478, flashinfer/attention/_core.py:517), and run() takes the custom mask mode
    (flashinfer/prefill.py:5112), but its AttentionSink variant never reads a mask
    (flashinfer/jit/attention/variants.py:34-36, where DefaultAttention reads it:
    include/flashinfer/attention/variants.cuh:80-85): fa2 runs non-causal
Control: the same wrapper planned causal=True, no mask
Expected: float32 softmax over the keys each query should see, in main(): rel-L2 <= 0.01, <= 0.05 per row; else exit 1
"""
import inspect
import subprocess
import sys

import flashinfer
import torch


def main(dev="cuda"):
    bf16, i32 = torch.bfloat16, torch.int32
    kv_indices = torch.randperm(71, generator=torch.Generator().manual_seed(1)).to(i32)  # pages, shuffled
    g = torch.Generator(dev).manual_seed(0)
    q, k_cache, v_cache = (torch.randn(shape, generator=g, device=dev).to(bf16)
                           for shape in ((7, 64, 64), (71, 1, 8, 64), (71, 1, 8, 64)))
    sinks = 3.0 + 2.0 * torch.randn(64, generator=torch.Generator(dev).manual_seed(7), device=dev)
    k, v = (c[kv_indices.long()].flatten(0, 1)[:71].float().repeat_interleave(8, dim=1) for c in (k_cache, v_cache))
    seen = torch.ones(7, 71, dtype=torch.bool, device=dev).tril(64)  # query i: keys 0 .. 64 + i
    s = (torch.einsum("qhd,khd->hqk", q.float(), k) * 0.125).masked_fill(~seen, float("-inf"))
    s = torch.cat([s, sinks[:, None, None].expand(-1, 7, 1)], dim=-1)  # each head's sink joins the softmax
    expected, out = torch.einsum("hqk,khd->qhd", s.softmax(dim=-1)[..., :71], v), torch.empty_like(q)  # float32
    qo_indptr, kv_indptr, kv_last_page_len = (torch.tensor(v, dtype=i32) for v in ([0, 7], [0, 71], [1]))
    sink_wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(
        q.new_empty(268435456, dtype=torch.uint8), "NHD", backend="fa2", q_data_type=bf16, kv_data_type=bf16,
        head_dim_qk=64, head_dim_vo=64, window_left=-1)
    sink_wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=64, num_kv_heads=8, q_data_type=bf16,
        kv_data_type=bf16, sm_scale=0.125, custom_mask=seen.flatten(), causal=False, head_dim_qk=64, window_left=-1,
        page_size=1, **taken_by(sink_wrapper.plan, uniform_q_len=7))
    wrong, what = outcome(lambda: sink_wrapper.run(q, (k_cache, v_cache), sinks, 0.125, out=out), out, expected)
    print(("REPRODUCED: " if wrong else "NOT REPRODUCED: ") + what)
    sink_wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=64, num_kv_heads=8, q_data_type=bf16,
        kv_data_type=bf16, sm_scale=0.125, causal=True, window_left=-1, head_dim_qk=64, page_size=1,
        **taken_by(sink_wrapper.plan, uniform_q_len=7))
    what = outcome(lambda: sink_wrapper.run(q, (k_cache, v_cache), sinks, 0.125, out=out), out, expected)[1]
    print('CONTROL, the same wrapper planned causal=True, no mask: ' + what)
    print(subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True).stdout)
    return 1 if wrong else 0


def outcome(step, out, expected, rel_l2=0.01, row_rel_l2=0.05):
    """(wrong, what): step() writes out (NaN first: a row it never writes is wrong), held to expected."""
    out.fill_(float("nan"))
    try:
        step()
        torch.cuda.synchronize()
    except RuntimeError as e:  # an illegal memory access or a launch failure: the call never finished
        return True, f"crash: {str(e).strip().splitlines()[0]}"
    err = (out.float() - expected).nan_to_num(nan=float("inf"))
    row = (err.norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-6)).amax(dim=-1)  # rel-L2 of each row's worst head
    rel, bad = float(err.norm() / expected.norm()), (row > row_rel_l2).nonzero().flatten().tolist()
    rows = f"{len(bad)} of {len(row)} rows wrong, {bad[0]}-{bad[-1]}" if bad else "every row right"
    return rel > rel_l2 or bool(bad), f"{rows} (rel-L2 {rel:.3g}, worst row {float(row.max()):.3g}; tolerances " \
                                      f"{rel_l2:g}, {row_rel_l2:g})"


def taken_by(fn, **keywords):  # the keywords this release's fn takes: 0.6 plans without uniform_q_len
    return {k: v for k, v in keywords.items() if k in inspect.signature(fn).parameters}


if __name__ == "__main__":
    sys.exit(main())
