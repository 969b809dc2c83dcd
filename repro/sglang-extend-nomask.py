#!/usr/bin/env python3
"""SGLang's extend before sglang#26513: the unmasked prefix shows keys before the window

Call: BatchPrefillWithRaggedKVCacheWrapper(backend='fa2'), then plan(causal=True, window_left=127), run();
    BatchPrefillWithPagedKVCacheWrapper(backend='fa2'), then plan(causal=False), run(); merge_state_in_place()
Shape: batch 1; qo_len 200; kv_len 500; 32 query, 8 KV heads; head_dim 128; page_size 16; window_left 127; bfloat16
Fault: SGLang bug: fixed by sglang#26513: its FlashInfer extend path planned the cached prefix without the window mask
Control: the same calls with the window as the prefix's custom_mask
Expected: float32 softmax over the keys each query should see, in main(): rel-L2 <= 0.01, <= 0.05 per row; else exit 1
"""
import subprocess
import sys

import flashinfer
import torch


def main(dev="cuda"):
    bf16, i32 = torch.bfloat16, torch.int32
    kv_indices = torch.randperm(32, generator=torch.Generator().manual_seed(1)).to(i32)  # pages, shuffled
    g = torch.Generator(dev).manual_seed(0)
    q, k_cache, v_cache = (torch.randn(shape, generator=g, device=dev).to(bf16)
                           for shape in ((200, 32, 128), (32, 16, 8, 128), (32, 16, 8, 128)))
    slots = (kv_indices.long()[:, None] * 16 + torch.arange(16)).flatten()[:500]  # each key's cache slot
    k, v = (c[kv_indices.long()].flatten(0, 1)[:500].float().repeat_interleave(4, dim=1) for c in (k_cache, v_cache))
    seen = torch.ones(200, 500, dtype=torch.bool, device=dev).tril(300).triu(173)  # query i: keys 173 + i .. 300 + i
    s = (torch.einsum("qhd,khd->hqk", q.float(), k) * 0.08838834764831845).masked_fill(~seen, float("-inf"))
    expected, out = torch.einsum("hqk,khd->qhd", s.softmax(dim=-1), v), torch.empty_like(q)  # float32
    qo_indptr = torch.tensor([0, 200], dtype=i32)
    workspace = q.new_empty(268435456, dtype=torch.uint8)
    ragged_wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2")
    paged_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    ragged_wrapper.plan(
        qo_indptr, qo_indptr, num_qo_heads=32, num_kv_heads=8, head_dim_qk=128, q_data_type=bf16, kv_data_type=bf16,
        sm_scale=0.08838834764831845, causal=True, window_left=127)
    paged_wrapper.plan(
        qo_indptr, torch.tensor([0, 9], dtype=i32), kv_indices[10:19], torch.tensor([12], dtype=i32), num_qo_heads=32,
        num_kv_heads=8, head_dim_qk=128, q_data_type=bf16, kv_data_type=bf16, sm_scale=0.08838834764831845,
        causal=False, page_size=16)
    k_new, v_new = (q.new_zeros((200, 8, 128), dtype=bf16) for _ in range(2))
    idx1 = slots[300:500].to(dev)
    lse_new, lse_prefix = (q.new_zeros((200, 32), dtype=torch.float32) for _ in range(2))
    prefix_out = q.new_zeros((200, 32, 128), dtype=bf16)
    def step():
        torch.index_select(k_cache.view(-1, 8, 128), 0, idx1, out=k_new)
        torch.index_select(v_cache.view(-1, 8, 128), 0, idx1, out=v_new)
        ragged_wrapper.run(q, k_new, v_new, out=out, lse=lse_new, return_lse=True)
        paged_wrapper.run(q, (k_cache, v_cache), out=prefix_out, lse=lse_prefix, return_lse=True)
        flashinfer.merge_state_in_place(out, lse_new, prefix_out, lse_prefix)
    wrong, what = outcome(step, out, expected)
    print(("REPRODUCED: " if wrong else "NOT REPRODUCED: ") + what)
    paged_wrapper.plan(
        qo_indptr, torch.tensor([0, 9], dtype=i32), kv_indices[10:19], torch.tensor([12], dtype=i32), num_qo_heads=32,
        num_kv_heads=8, head_dim_qk=128, q_data_type=bf16, kv_data_type=bf16, sm_scale=0.08838834764831845,
        causal=False, page_size=16, custom_mask=seen[:, 160:300].flatten())
    what = outcome(step, out, expected)[1]
    print("CONTROL, the same calls with the window as the prefix's custom_mask: " + what)
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


if __name__ == "__main__":
    sys.exit(main())
