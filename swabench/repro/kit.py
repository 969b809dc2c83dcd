"""The helpers a reproducer script carries below its call, copied into it and cut to the case
(``script.specialize``): an ``if`` that reads only ``case[...]`` keeps the branch the case takes, so a script
holds no code its case never runs.  They import torch only.  ``make_inputs`` builds a case's tensors exactly as
``core.workloads.build`` does (the tests hold the two equal); ``reference`` and ``outcome`` are the gate's
random-input check written out plainly.  Each function here must stand alone: no module-level names but
``torch``, and ``case[...]`` in every test that depends on the case."""

import torch


def make_inputs(case, device):
    """The case's tensors as swabench builds them: the page table (pages in a seeded random order unless
    contiguous), then N(0, 1) data from one seeded generator on the device."""
    qo_lens, kv_lens, ps, n = case["qo_lens"], case["kv_lens"], case["page_size"], len(case["kv_lens"])
    slot_start = [sum(kv_lens[:b]) for b in range(n + 1)]
    x = {"qo_indptr": torch.tensor([sum(qo_lens[:b]) for b in range(n + 1)], dtype=torch.int32),
         "slot_start": slot_start}
    if case["storage"] == "paged":
        pages = [-(-k // ps) for k in kv_lens]
        indptr = [sum(pages[:b]) for b in range(n + 1)]
        if case["page_layout"] == "contiguous":
            indices = list(range(indptr[-1]))
        else:
            indices = torch.randperm(indptr[-1], generator=torch.Generator().manual_seed(case["seed"] + 1)).tolist()
        if case["page_layout"].startswith("evicted") and case["window_left"] >= 0:
            spare = evict_pages(case, indptr, indices)
        x["kv_indptr"] = torch.tensor(indptr, dtype=torch.int32)
        x["kv_indices"] = torch.tensor(indices, dtype=torch.int32)
        x["kv_last_page_len"] = torch.tensor([k - (p - 1) * ps for k, p in zip(kv_lens, pages)], dtype=torch.int32)
        request = torch.repeat_interleave(torch.arange(n), torch.tensor(kv_lens))
        j = torch.arange(slot_start[-1]) - torch.tensor(slot_start[:-1])[request]  # each key's position
        x["slots"] = torch.tensor(indices)[torch.tensor(indptr[:-1])[request] + j // ps] * ps + j % ps
        shape = (max(indices + [indptr[-1] - 1]) + 1, ps, case["num_kv_heads"], case["head_dim"])
    else:
        x["kv_indptr"], x["slots"] = torch.tensor(slot_start, dtype=torch.int32), torch.arange(slot_start[-1])
        shape = (slot_start[-1], case["num_kv_heads"], case["head_dim"])
    dtype, cache_dtype = ({"float8_e4m3": torch.float8_e4m3fn}.get(d) or getattr(torch, d)
                          for d in (case["dtype"], case["cache_dtype"]))
    g = torch.Generator(device=device).manual_seed(case["seed"])
    x["q"] = torch.randn((sum(qo_lens), case["num_qo_heads"], case["head_dim"]), generator=g, device=device).to(dtype)
    x["k_cache"], x["v_cache"] = (torch.randn(shape, generator=g, device=device).to(cache_dtype) for _ in "kv")
    if case["soft_cap"]:  # logits around 0.3 cap (std 0.1 cap), where tanh bends them
        cap, scale = case["soft_cap"], case["sm_scale"]
        x["q"].mul_(0.1 * cap / scale / (case["head_dim"] - 1) ** 0.5)
        x["q"][..., 0] = 0.3 * cap / scale
        x["k_cache"][..., 0] = 1
    if case["sinks"]:
        gs = torch.Generator(device=device).manual_seed(case["seed"] + 7)
        x["sinks"] = 3.0 + 2.0 * torch.randn((case["num_qo_heads"],), generator=gs, device=device)
    if case["storage"] == "paged" and case["page_layout"].startswith("evicted") and case["window_left"] >= 0:
        for name in ("k_cache", "v_cache"):  # what an evicted page holds: a leaked key's logit rules its row
            x[name][spare] = 100.0
    return x


def evict_pages(case, indptr, indices):
    """Point the pages wholly before each request's first window elsewhere, as a server that evicts them
    does (one shared null page, or pages other requests still hold); the null page's index, or []."""
    ps, n, w = case["page_size"], len(case["kv_lens"]), case["window_left"]
    gone = [max(0, k - q - w) // ps for q, k in zip(case["qo_lens"], case["kv_lens"])]
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
    return [spare] if spare in indices else []


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


def block_visible(qo_len, kv_len, block, key_offset=0, device=None):
    """Bool [qo_len, kv_len - key_offset], True where key j is in query i's own block of ``block`` queries
    (counted from the first), which it sees both ways whatever its window says."""
    first = kv_len - qo_len + torch.arange(qo_len, device=device)[:, None] // block * block
    j = torch.arange(key_offset, kv_len, device=device)[None, :]
    return (j >= first) & (j < first + block)


def block_ranges(case):
    """Each query's bidirectional span, the first and last key of its block of ``case["block"]`` queries (counted
    from its request's first): int32 ``[total_q, 2]``, the ranges wrapper's ``bidirectional_ranges``."""
    spans = []
    for qo, kv in zip(case["qo_lens"], case["kv_lens"]):
        first = kv - qo + torch.arange(qo) // case["block"] * case["block"]
        spans.append(torch.stack([first, torch.clamp(first + case["block"] - 1, max=kv - 1)], dim=1))
    return torch.cat(spans).to(torch.int32).contiguous()


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


def key_slots(x, starts, ends):
    """The cache slots of keys [start, end) of each request, concatenated (where a recipe copies them)."""
    return torch.cat([x["slots"][x["slot_start"][b] + s:x["slot_start"][b] + e]
                      for b, (s, e) in enumerate(zip(starts, ends))])


def window_mask(case, starts, ends, device=None, window_left=None):
    """The flattened custom mask of each request's keys [start, end): its rows of the exact visibility (its draft
    tree's, where it has one), with ``window_left`` in place of the case's where given (-1: the tree alone, for a
    plan() that applies the window itself)."""
    w = case["window_left"] if window_left is None else window_left
    trees = case.get("parents") or [None] * len(starts)
    rows = [visible(q, k, w, case["causal"], case["chunk"], device=device, parents=t)[:, s:e]
            for q, k, s, e, t in zip(case["qo_lens"], case["kv_lens"], starts, ends, trees)]
    if case.get("block"):  # and each query's own block of queries, both ways
        rows = [r | block_visible(q, k, case["block"], device=device)[:, s:e]
                for r, q, k, s, e in zip(rows, case["qo_lens"], case["kv_lens"], starts, ends)]
    return torch.cat([r.reshape(-1) for r in rows])


def seen(case, b, device):
    """Bool [qo_len, kv_len] of request b: True where query i, at position kv_len - qo_len + i, sees key j."""
    qo, kv = case["qo_lens"][b], case["kv_lens"][b]
    position = torch.arange(kv - qo, kv, device=device)[:, None]
    key = torch.arange(kv, device=device)[None, :]
    allowed = torch.ones(qo, kv, dtype=torch.bool, device=device)
    if case.get("parents"):  # a draft tree: a node sits at prefix + its depth, and sees its ancestors of the draft
        parents, prefix, depth = case["parents"][b], kv - qo, [0] * qo
        ancestors = torch.eye(qo, dtype=torch.bool, device=device)
        for i in range(1, qo):
            depth[i] = depth[parents[i]] + 1
            ancestors[i] |= ancestors[parents[i]]
        position = prefix + torch.tensor(depth, device=device)[:, None]
        key = torch.cat([key[0, :prefix], position[:, 0]])[None, :]
        allowed[:, prefix:] = ancestors
    if case["causal"]:
        allowed &= key <= position
    if case["window_left"] >= 0:
        allowed &= key >= position - case["window_left"]
    if case["chunk"] > 0:
        allowed &= key >= position - position % case["chunk"]
    if case.get("block"):  # and its own block of B queries (counted from the first), both ways
        first = kv - qo + torch.arange(qo, device=device)[:, None] // case["block"] * case["block"]
        allowed |= (key >= first) & (key < first + case["block"])
    return allowed


def reference(case, x):
    """The exact output in float32: per request, softmax(scale * q k^T) v over the keys its page table holds,
    masked as ``seen`` says."""
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
        s = s.masked_fill(~seen(case, b, s.device), float("-inf"))
        if case["sinks"]:  # each head's sink logit joins the denominator
            s = torch.cat([s, x["sinks"].float()[:, None, None].expand(-1, qo, 1)], dim=-1)
        out[row:row + qo] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1)[..., :kv], v)
        row += qo
    return out


def outcome(case, x, step, out, tolerance):
    """Run ``step`` into ``out`` (NaN first: a row it never writes reads as wrong) and hold it to the reference:
    (wrong, what, the worst row's values).  A row is wrong where a head's rel-L2 error passes the row tolerance."""
    out.fill_(float("nan"))
    try:
        step()
        if out.is_cuda:
            torch.cuda.synchronize()
    except RuntimeError as e:  # an illegal memory access or a launch failure: the call never finished
        return True, f"crash: {str(e).strip().splitlines()[0]}", []
    ref, got = reference(case, x), out.float()
    diff = (got - ref).nan_to_num(nan=float("inf"))
    rel, head_err = float(diff.norm() / ref.norm()), diff.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)
    row_err = head_err.amax(dim=-1)
    bad = row_err > tolerance["row_rel_l2"]
    errors = f"rel-L2 {rel:.3g}, worst row {float(row_err.max()):.3g}; tolerances {tolerance['rel_l2']:g}, " \
             f"{tolerance['row_rel_l2']:g}"
    if rel <= tolerance["rel_l2"] and not bad.any():
        return False, f"right ({errors})", []
    w, starts = int(row_err.argmax()), [0] + torch.tensor(case["qo_lens"]).cumsum(0).tolist()
    b, h = sum(start <= w for start in starts[1:-1]), int(head_err[w].argmax())
    values = ", ".join(f"{name} {[round(v, 3) for v in t[w, h, :4].tolist()]}" for name, t in (("expected", ref),
                                                                                               ("got", got)))
    return True, f"{wrong_rows(case, bad)} ({errors})", [f"worst: request {b} row {w - starts[b]}, head {h}, "
                                                          f"first values {values}"]


def wrong_rows(case, bad):
    """'request 0: rows 0-863 wrong': each request's wrong rows as ranges, neighbouring requests with the same
    ranges said once ('requests 0-31: rows 0-7 wrong')."""
    said = []
    for b, rows in enumerate(bad.split(case["qo_lens"])):
        i = rows.nonzero().flatten().tolist()
        runs = zip([r for k, r in enumerate(i) if k == 0 or i[k - 1] < r - 1],
                   [r for k, r in enumerate(i) if k == len(i) - 1 or i[k + 1] > r + 1])
        text = ", ".join(f"{a}-{z}" if z > a else f"{a}" for a, z in runs)
        if text and said and said[-1][1:] == [b - 1, text]:
            said[-1][1] = b
        elif text:
            said.append([b, b, text])
    return "; ".join((f"request {a}" if a == z else f"requests {a}-{z}") + f": rows {text} wrong"
                     for a, z, text in said) or "no row past the row tolerance"


def environment():
    """What a maintainer asks first: Python, torch and its CUDA, the GPU (compute capability, SMs) and its driver,
    the flashinfer packages; then FlashInfer's own report (python -m flashinfer.collect_env) where the release has
    one."""
    import importlib.metadata, platform, subprocess, sys

    lines = [f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})"]
    if torch.cuda.is_available():
        p, smi = torch.cuda.get_device_properties(0), "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
        driver = subprocess.run(smi.split(), capture_output=True, text=True).stdout.split() or ["unknown"]
        lines.append(f"{p.name}: compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                     f"driver {driver[0]}")
    lines += [f"{d.metadata['Name']} {d.version}" for d in importlib.metadata.distributions()
              if (d.metadata["Name"] or "").lower().startswith("flashinfer")]
    report = subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True)
    return lines + ([report.stdout.rstrip()] if report.returncode == 0 else [])
