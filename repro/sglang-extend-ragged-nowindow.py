#!/usr/bin/env python3
"""sglang-extend-ragged-nowindow

What is wrong: SGLang's extend as written at 0005834c: the ragged part planned without a window and given W at
    run, which only skips whole tiles: a query sees new tokens before its window
Where it shows: extend b2 p300 q200 W127 ps16 h32/8 d128 bfloat16 s0
Made by: swabench repro --bug sglang-extend-ragged-nowindow
Run it with python3 on a machine with torch, flashinfer and a CUDA GPU. It prints the versions and the GPU,
    the errors and the wrong (request, rows) ranges, and exits 1 when the output is wrong, 0 when it is right.
"""

import sys

import torch

import flashinfer

CASE = dict(
    qo_lens=[200, 200], kv_lens=[500, 500], num_qo_heads=32, num_kv_heads=8, head_dim=128, storage='paged',
    page_size=16, page_layout='scattered', window_left=127, causal=True, chunk=0, soft_cap=0.0, sinks=False,
    sm_scale=0.08838834764831845, dtype='bfloat16', cache_dtype='bfloat16', seed=0)
TOLERANCE = {'rel_l2': 0.01, 'row_rel_l2': 0.05}  # swabench's gate on random inputs, bfloat16
DEVICE = "cuda"


def make_inputs(case, device):
    """The case's tensors as swabench builds them: pages in a seeded random order (unless contiguous),
    the pages wholly before a request's first window pointed elsewhere when evicted (one shared null
    page, or pages other requests still hold), then N(0, 1) data from one seeded generator on the device."""
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
              "float8_e4m3": torch.float8_e4m3fn}
    qo_lens, kv_lens, ps = case["qo_lens"], case["kv_lens"], case["page_size"]
    h, hkv, d, w = case["num_qo_heads"], case["num_kv_heads"], case["head_dim"], case["window_left"]
    n = len(kv_lens)
    slot_start = [sum(kv_lens[:b]) for b in range(n + 1)]
    x = {"qo_indptr": torch.tensor([sum(qo_lens[:b]) for b in range(n + 1)], dtype=torch.int32)}
    spare_pages = []
    if case["storage"] == "paged":
        pages = [-(-k // ps) for k in kv_lens]
        indptr = [sum(pages[:b]) for b in range(n + 1)]
        order = torch.arange(indptr[-1])
        if case["page_layout"] != "contiguous":
            order = torch.randperm(indptr[-1], generator=torch.Generator().manual_seed(case["seed"] + 1))
        indices = order.tolist()
        if case["page_layout"].startswith("evicted") and w >= 0:
            gone = [max(0, k - q - w) // ps for q, k in zip(qo_lens, kv_lens)]
            spare = max(indices) + 1
            pool = [(b, p) for b in range(n) for p in indices[indptr[b] + gone[b]:indptr[b + 1]]]
            turn = 0
            for b in range(n):
                shared = case["page_layout"] == "evicted-reused" and any(owner != b for owner, _ in pool)
                for i in range(gone[b]):
                    if not shared:
                        indices[indptr[b] + i] = spare
                        continue
                    while pool[turn % len(pool)][0] == b:
                        turn += 1
                    indices[indptr[b] + i] = pool[turn % len(pool)][1]
                    turn += 1
            spare_pages = [spare] if spare in indices else []
        num_pages = max(indices + [indptr[-1] - 1]) + 1
        x["kv_indptr"] = torch.tensor(indptr, dtype=torch.int32)
        x["kv_indices"] = torch.tensor(indices, dtype=torch.int32)
        x["kv_last_page_len"] = torch.tensor([k - (p - 1) * ps for k, p in zip(kv_lens, pages)], dtype=torch.int32)
        request = torch.repeat_interleave(torch.arange(n), torch.tensor(kv_lens))
        j = torch.arange(slot_start[-1]) - torch.tensor(slot_start[:-1])[request]  # each key's position
        x["slots"] = torch.tensor(indices)[torch.tensor(indptr[:-1])[request] + j // ps] * ps + j % ps
        shape = (num_pages, ps, hkv, d)
    else:
        x["kv_indptr"] = torch.tensor(slot_start, dtype=torch.int32)
        x["slots"] = torch.arange(slot_start[-1])
        shape = (slot_start[-1], hkv, d)
    x["slot_start"] = slot_start
    g = torch.Generator(device=device).manual_seed(case["seed"])
    x["q"] = torch.randn((sum(qo_lens), h, d), generator=g, device=device).to(dtypes[case["dtype"]])
    for name in ("k_cache", "v_cache"):
        x[name] = torch.randn(shape, generator=g, device=device).to(dtypes[case["cache_dtype"]])
    cap, scale = case["soft_cap"], case["sm_scale"]
    if cap:  # logits around 0.3 cap (std 0.1 cap), where tanh bends them
        x["q"].mul_(0.1 * cap / scale / (d - 1) ** 0.5)
        x["q"][..., 0] = 0.3 * cap / scale
        x["k_cache"][..., 0] = 1
    x["sinks"] = None
    if case["sinks"]:
        gs = torch.Generator(device=device).manual_seed(case["seed"] + 7)
        x["sinks"] = 3.0 + 2.0 * torch.randn((h,), generator=gs, device=device)
    for name in ("k_cache", "v_cache"):  # what an evicted page holds: a leaked key's logit rules its row
        if spare_pages:
            x[name][spare_pages] = 100.0
    return x


def table_slice(case, x, starts, ends, requests=None):
    """The page table of keys [start, end) of each entry's request (entry b is request b unless
    ``requests`` says otherwise): (indptr, indices, last_page_len), int32 on the host."""
    ps, requests = case["page_size"], requests or list(range(len(starts)))
    indptr, indices, last = [0], [], []
    for b, s, e in zip(requests, starts, ends):
        first = int(x["kv_indptr"][b])
        indices += x["kv_indices"][first + s // ps:first - (-e // ps)].tolist()
        indptr.append(len(indices))
        last.append(e - (-(-e // ps) - 1) * ps)
    return tuple(torch.tensor(v, dtype=torch.int32) for v in (indptr, indices, last))


def window_mask(case, starts, ends, device=None):
    """The flattened custom mask of each request's keys [start, end): its rows of the exact visibility."""
    rows = [visible(q, k, case["window_left"], case["causal"], case["chunk"], device=device)[:, s:e]
            for q, k, s, e in zip(case["qo_lens"], case["kv_lens"], starts, ends)]
    return torch.cat([r.reshape(-1) for r in rows])


def visible(qo_len, kv_len, window_left=-1, causal=True, chunk=0, first_key=0, future=0, latest_start=None,
            key_offset=0, device=None):
    """Bool [qo_len, kv_len - key_offset], True where query i (at position kv_len - qo_len + i) sees key j:
    j >= p - window_left, j >= its chunk's start, j >= first_key (the earliest start clipped to latest_start),
    and j <= p + future when causal."""
    p = torch.arange(kv_len - qo_len, kv_len, device=device)
    lo = torch.full_like(p, first_key)
    if window_left >= 0:
        lo = torch.maximum(lo, p - window_left)
    if chunk > 0:
        lo = torch.maximum(lo, p - p % chunk)
    if latest_start is not None:
        lo = torch.clamp(lo, max=latest_start)
    hi = torch.clamp(p + future, max=kv_len - 1) if causal else torch.full_like(p, kv_len - 1)
    j = torch.arange(key_offset, kv_len, device=device)
    return (j[None, :] >= lo[:, None]) & (j[None, :] <= hi[:, None])


def reference(case, x):
    """The exact output in float32: per request, softmax(scale * q k^T) v over the keys its page table holds,
    with the soft-cap cap * tanh(s / cap), the window/chunk/causal mask, and each head's sink logit in
    the denominator."""
    h, hkv, d = case["num_qo_heads"], case["num_kv_heads"], case["head_dim"]
    k_all, v_all = x["k_cache"].reshape(-1, hkv, d), x["v_cache"].reshape(-1, hkv, d)
    out, row = torch.empty(x["q"].shape, dtype=torch.float32, device=x["q"].device), 0
    for b, (qo, kv) in enumerate(zip(case["qo_lens"], case["kv_lens"])):
        slots = x["slots"][x["slot_start"][b]:x["slot_start"][b + 1]].to(x["q"].device)
        k = k_all[slots].float().repeat_interleave(h // hkv, dim=1)
        v = v_all[slots].float().repeat_interleave(h // hkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", x["q"][row:row + qo].float(), k) * case["sm_scale"]
        if case["soft_cap"]:
            s = case["soft_cap"] * torch.tanh(s / case["soft_cap"])
        mask = visible(qo, kv, case["window_left"], case["causal"], case["chunk"], device=s.device)
        s = s.masked_fill(~mask, float("-inf"))
        if x["sinks"] is not None:
            s = torch.cat([s, x["sinks"].float()[:, None, None].expand(-1, qo, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :kv]
        out[row:row + qo] = torch.einsum("hqk,khd->qhd", p, v)
        row += qo
    return out


def report(case, out, ref, tolerance):
    """Print the errors and the wrong (request, rows) ranges; return 1 when the output is wrong, else 0.
    A row is wrong where some head's rel-L2 error passes the row tolerance or it was never written (NaN)."""
    out = out.float()
    diff = torch.where(torch.isnan(out), torch.full_like(out, float("inf")), out - ref)
    rel = float(diff.norm() / ref.norm())
    row_err = (diff.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)).amax(dim=-1)
    wrong = row_err > tolerance["row_rel_l2"]
    print(f"max abs error {float(diff.abs().max()):.4g}, rel-L2 {rel:.4g} (tolerance {tolerance['rel_l2']:g}), "
          f"worst row rel-L2 {float(row_err.max()):.4g} (tolerance {tolerance['row_rel_l2']:g})")
    row = 0
    for b, qo in enumerate(case["qo_lens"]):
        bad = wrong[row:row + qo].nonzero().flatten().tolist()
        runs = []
        for i in bad:
            if runs and runs[-1][1] == i - 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        if runs:
            print(f"request {b}: rows " + ", ".join(f"{a}-{z}" if z > a else f"{a}" for a, z in runs)
                  + f" of {qo} wrong")
        row += qo
    failed = rel > tolerance["rel_l2"] or bool(wrong.any())
    print("WRONG" if failed else "RIGHT")
    return 1 if failed else 0


def main():
    dev = torch.device(DEVICE)
    print(f"torch {torch.__version__}, flashinfer {flashinfer.__version__}, "
          + (torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"))
    # sglang-extend-ragged-nowindow on flashinfer (fa2): SGLang's extend as written at 0005834c: the ragged
    # part planned without a window and given W at run, which only skips whole tiles: a query sees new tokens
    # before its window
    x = make_inputs(CASE, dev)
    q = x["q"]
    k_cache = x["k_cache"]
    v_cache = x["v_cache"]
    qo_indptr = x["qo_indptr"]
    kv_indptr = x["kv_indptr"]
    out = torch.empty_like(x["q"])
    workspace = torch.empty((268435456,), dtype=torch.uint8, device=dev)
    ragged_wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        workspace, "NHD", backend="fa2", use_cuda_graph=True,
        qo_indptr_buf=torch.empty((3,), dtype=torch.int32, device=dev),
        kv_indptr_buf=torch.empty((3,), dtype=torch.int32, device=dev))
    paged_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        workspace, "NHD", backend="fa2", use_cuda_graph=True,
        qo_indptr_buf=torch.empty((3,), dtype=torch.int32, device=dev),
        paged_kv_indptr_buf=torch.empty((3,), dtype=torch.int32, device=dev),
        paged_kv_indices_buf=torch.empty((64,), dtype=torch.int32, device=dev),
        paged_kv_last_page_len_buf=torch.empty((2,), dtype=torch.int32, device=dev),
        custom_mask_buf=torch.empty((7000,), dtype=torch.uint8, device=dev),
        mask_indptr_buf=torch.empty((3,), dtype=torch.int32, device=dev))
    ragged_wrapper.plan(
        qo_indptr, qo_indptr, num_qo_heads=32, num_kv_heads=8, head_dim_qk=128, q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16, sm_scale=0.08838834764831845, causal=True, window_left=-1)
    kv_indptr_1, kv_indices_1, kv_last_page_len_1 = table_slice(CASE, x, starts=[160, 160], ends=[300, 300])
    m1 = window_mask(CASE, starts=[160, 160], ends=[300, 300], device=dev)
    paged_wrapper.plan(
        qo_indptr, kv_indptr_1, kv_indices_1, kv_last_page_len_1, num_qo_heads=32, num_kv_heads=8,
        head_dim_qk=128, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=0.08838834764831845,
        causal=False, page_size=16, custom_mask=m1)
    ragged_wrapper._window_left = 127
    k_new = torch.zeros((400, 8, 128), dtype=torch.bfloat16, device=dev)
    idx1 = torch.tensor([204, 205, 206, 207, 560, 561, 562, 563, 564, 565, 566, 567, 568, 569, 570, 571, 572, 573, 574, 575, 864, 865, 866, 867, 868, 869, 870, 871, 872, 873, 874, 875, 876, 877, 878, 879, 944, 945, 946, 947, 948, 949, 950, 951, 952, 953, 954, 955, 956, 957, 958, 959, 320, 321, 322, 323, 324, 325, 326, 327, 328, 329, 330, 331, 332, 333, 334, 335, 224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239, 368, 369, 370, 371, 372, 373, 374, 375, 376, 377, 378, 379, 380, 381, 382, 383, 640, 641, 642, 643, 644, 645, 646, 647, 648, 649, 650, 651, 652, 653, 654, 655, 272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127, 720, 721, 722, 723, 724, 725, 726, 727, 728, 729, 730, 731, 732, 733, 734, 735, 128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142, 143, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 624, 625, 626, 627, 940, 941, 942, 943, 672, 673, 674, 675, 676, 677, 678, 679, 680, 681, 682, 683, 684, 685, 686, 687, 704, 705, 706, 707, 708, 709, 710, 711, 712, 713, 714, 715, 716, 717, 718, 719, 816, 817, 818, 819, 820, 821, 822, 823, 824, 825, 826, 827, 828, 829, 830, 831, 464, 465, 466, 467, 468, 469, 470, 471, 472, 473, 474, 475, 476, 477, 478, 479, 992, 993, 994, 995, 996, 997, 998, 999, 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 384, 385, 386, 387, 388, 389, 390, 391, 392, 393, 394, 395, 396, 397, 398, 399, 336, 337, 338, 339, 340, 341, 342, 343, 344, 345, 346, 347, 348, 349, 350, 351, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 688, 689, 690, 691, 692, 693, 694, 695, 696, 697, 698, 699, 700, 701, 702, 703, 448, 449, 450, 451, 452, 453, 454, 455, 456, 457, 458, 459, 460, 461, 462, 463, 288, 289, 290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 832, 833, 834, 835, 836, 837, 838, 839, 840, 841, 842, 843, 844, 845, 846, 847, 176, 177, 178, 179], dtype=torch.int64, device=dev)
    v_new = torch.zeros((400, 8, 128), dtype=torch.bfloat16, device=dev)
    lse_new = torch.zeros((400, 32), dtype=torch.float32, device=dev)
    prefix_out = torch.zeros((400, 32, 128), dtype=torch.bfloat16, device=dev)
    lse_prefix = torch.zeros((400, 32), dtype=torch.float32, device=dev)

    def step():
        t1 = k_cache.view(-1, 8, 128)
        torch.index_select(t1, 0, idx1, out=k_new)
        t2 = v_cache.view(-1, 8, 128)
        torch.index_select(t2, 0, idx1, out=v_new)
        ragged_wrapper.run(q, k_new, v_new, out=out, lse=lse_new, return_lse=True)
        paged_wrapper.run(q, (k_cache, v_cache), out=prefix_out, lse=lse_prefix, return_lse=True)
        flashinfer.merge_state_in_place(out, lse_new, prefix_out, lse_prefix)

    out.fill_(float("nan"))  # a row the call never writes reads as wrong
    step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return report(CASE, out, reference(CASE, x), TOLERANCE)


if __name__ == "__main__":
    sys.exit(main())
