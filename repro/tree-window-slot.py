#!/usr/bin/env python3
"""window_left with a draft tree as custom_mask: the window counts from the query's row, not its depth

Call: BatchPrefillWithPagedKVCacheWrapper(backend='fa2'), then plan(causal=False, window_left=127, custom_mask=...),
    run()
Shape: batch 1; qo_len 16; kv_len 316; 32 query, 8 KV heads; head_dim 128; page_size 1; window_left 127; a draft tree;
    bfloat16
Fault: FlashInfer docs gap: window_left's docstring (flashinfer/prefill.py:3690) does not say that the window counts
    from the query's row kv_len - qo_len + i (include/flashinfer/attention/variants.cuh:89), with a custom mask too
Control: the window by tree depth in custom_mask, the table from the window's first page, no window_left
Expected: the call is the window from each query's row, as designed, which differs from the window by depth on rows
    2-15 (14 of 16): rel-L2 <= 0.01, <= 0.05 per row; else exit 1
"""
import inspect
import subprocess
import sys

import flashinfer
import torch


def main(dev="cuda"):
    bf16, i32 = torch.bfloat16, torch.int32
    kv_indices = torch.randperm(316, generator=torch.Generator().manual_seed(1)).to(i32)  # pages, shuffled
    g = torch.Generator(dev).manual_seed(0)
    q, k_cache, v_cache = (torch.randn(shape, generator=g, device=dev).to(bf16)
                           for shape in ((16, 32, 128), (316, 1, 8, 128), (316, 1, 8, 128)))
    k, v = (c[kv_indices.long()].flatten(0, 1)[:316].float().repeat_interleave(4, dim=1) for c in (k_cache, v_cache))
    parents = [-1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 5, 5, 9]  # the draft tree: each node's parent (-1: the root)
    depth, tree = [0] * 16, torch.eye(16, dtype=torch.bool, device=dev)  # tree[i, j]: j is i or its ancestor
    for i in range(1, 16):
        depth[i], tree[i] = depth[parents[i]] + 1, tree[i] | tree[parents[i]]
    position = 300 + torch.tensor(depth, device=dev)[:, None]  # node i sits at 300 + its depth
    key = torch.cat([torch.arange(300, device=dev), position[:, 0]])  # a draft key at its node
    allowed = torch.cat([torch.ones(16, 300, dtype=torch.bool, device=dev), tree], dim=1)
    seen = allowed & (key >= position - 127)
    row_seen = allowed & (torch.arange(316, device=dev) >= torch.arange(300, 316, device=dev)[:, None] - 127)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * 0.08838834764831845
    attend = lambda m: torch.einsum("hqk,khd->qhd", s.masked_fill(~m, float("-inf")).softmax(dim=-1), v)
    expected, designed, out = attend(seen), attend(row_seen), torch.empty_like(q)  # float32
    qo_indptr, kv_indptr, kv_last_page_len = (torch.tensor(v, dtype=i32) for v in ([0, 16], [0, 316], [1]))
    paged_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        q.new_empty(268435456, dtype=torch.uint8), "NHD", backend="fa2")
    paged_wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=32, num_kv_heads=8, q_data_type=bf16,
        kv_data_type=bf16, sm_scale=0.08838834764831845, custom_mask=allowed.flatten(), causal=False, head_dim_qk=128,
        window_left=127, page_size=1, **taken_by(paged_wrapper.plan, uniform_q_len=16))
    wrong, what = outcome(lambda: paged_wrapper.run(q, (k_cache, v_cache), out=out), out, designed)
    differ = (seen != row_seen).any(dim=1).nonzero().flatten().tolist()  # the rows whose two windows differ
    print(f"{'REPRODUCED' if wrong else 'DOCUMENTATION GAP'}: row-anchored and depth-anchored windows differ on rows "
          f"{differ[0]}-{differ[-1]} ({len(differ)} of 16); the call against the row-anchored one: {what}")
    paged_wrapper.plan(
        qo_indptr, torch.tensor([0, 143], dtype=i32), kv_indices[173:316], torch.tensor([1], dtype=i32),
        num_qo_heads=32, num_kv_heads=8, q_data_type=bf16, kv_data_type=bf16, sm_scale=0.08838834764831845,
        custom_mask=seen[:, 173:316].flatten(), causal=False, head_dim_qk=128, page_size=1,
        **taken_by(paged_wrapper.plan, uniform_q_len=16))
    what = outcome(lambda: paged_wrapper.run(q, (k_cache, v_cache), out=out), out, expected)[1]
    print("CONTROL, the window by tree depth in custom_mask, the table from the window's first page, no "
          'window_left: ' + what)
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
