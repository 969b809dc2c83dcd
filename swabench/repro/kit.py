"""The helpers every reproducer script carries, copied into it verbatim: they import torch only, so a
script reads on its own.  ``make_inputs`` builds a case's tensors exactly as ``core.workloads.build``
does (the tests hold the two equal); ``reference`` and ``report`` are the gate's random-input check
written out plainly.  Each function here must stand alone: no module-level names but ``torch``."""

import torch


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


def taken_by(fn, **keywords):
    """The keywords ``fn`` takes: swabench passes these only where the installed release has them."""
    import inspect

    return {k: v for k, v in keywords.items() if k in inspect.signature(fn).parameters}


def visible(qo_len, kv_len, window_left=-1, causal=True, chunk=0, first_key=0, future=0, latest_start=None,
            key_offset=0, device=None, parents=None, by_slot=False):
    """Bool [qo_len, kv_len - key_offset], True where query i (at position kv_len - qo_len + i) sees key j:
    j >= p - window_left, j >= its chunk's start, j >= first_key (the earliest start clipped to latest_start),
    and j <= p + future when causal.  With ``parents`` (a draft tree, parent slot of each node, -1 for the root)
    node i sits at position prefix + its depth and sees, of the draft keys, itself and its ancestors, each at its
    own depth; ``by_slot`` measures both positions by slot instead, as a kernel that knows no tree does."""
    prefix = kv_len - qo_len
    p = torch.arange(prefix, kv_len, device=device)
    j = torch.arange(key_offset, kv_len, device=device)
    key_at = j
    allowed = torch.ones(qo_len, len(j), dtype=torch.bool, device=device)
    if parents is not None:
        depth = [0] * qo_len
        ancestors = torch.eye(qo_len, dtype=torch.bool, device=device)
        for i in range(1, qo_len):
            depth[i] = depth[parents[i]] + 1
            ancestors[i] |= ancestors[parents[i]]
        if not by_slot:
            slots = (j - prefix).clamp(min=0, max=qo_len - 1)
            key_at = torch.where(j >= prefix, prefix + torch.tensor(depth, device=device)[slots], j)
        draft = j >= prefix
        later = j[None, :] > p[:, None]  # a draft key after the node: seen only where ``future`` reaches it
        allowed = ~draft[None, :] | ancestors[:, (j - prefix).clamp(min=0)] | later
        position = p if by_slot else prefix + torch.tensor(depth, device=device)
    else:
        position = p
    lo = torch.full_like(p, first_key)
    if window_left >= 0:
        lo = torch.maximum(lo, position - window_left)
    if chunk > 0:
        lo = torch.maximum(lo, p - p % chunk)
    if latest_start is not None:
        lo = torch.clamp(lo, max=latest_start)
    hi = torch.clamp(p + future, max=kv_len - 1) if causal else torch.full_like(p, kv_len - 1)
    return allowed & (key_at[None, :] >= lo[:, None]) & (j[None, :] <= hi[:, None])


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


def window_mask(case, starts, ends, device=None, window_left=None):
    """The flattened custom mask of each request's keys [start, end): its rows of the exact visibility (its draft
    tree's, where it has one), with ``window_left`` in place of the case's where given (-1: the tree alone, for a
    plan() that applies the window itself)."""
    w = case["window_left"] if window_left is None else window_left
    trees = case.get("parents") or [None] * len(starts)
    rows = [visible(q, k, w, case["causal"], case["chunk"], device=device, parents=t)[:, s:e]
            for q, k, s, e, t in zip(case["qo_lens"], case["kv_lens"], starts, ends, trees)]
    return torch.cat([r.reshape(-1) for r in rows])


def reference(case, x):
    """The exact output in float32: per request, softmax(scale * q k^T) v over the keys its page table holds,
    with the soft-cap cap * tanh(s / cap), the window/chunk/causal mask (a draft tree's, by depth), and each
    head's sink logit in the denominator."""
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
        mask = visible(qo, kv, case["window_left"], case["causal"], case["chunk"], device=s.device,
                       parents=(case.get("parents") or [None] * (b + 1))[b])
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
