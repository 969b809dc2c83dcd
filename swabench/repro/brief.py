"""The two-screen script for flashinfer#4972: one request, its numbers written into main(), a float32 reference for
that request alone, and the control (the same plan with ``disable_split_kv=True``) in the same wrapper.

The traced scripts carry swabench's general kit (many requests, every mask feature); a comment on an upstream issue
reads best as a page or two a maintainer takes in at once.  ``check`` holds its calls, argument by argument and input by
value, to the suite's own on the same case, as every traced script is held.
"""

from __future__ import annotations

from string import Template

from swabench.core import workloads
from swabench.impls.flashinfer_workspace import WORKSPACE_BYTES
from swabench.repro import script, verify
from swabench.repro.script import Part

REF = "flashinfer#4972"
EXPECTED = ("each row is float32 softmax attention over its window (reference() below): rel-L2 at most 0.01 "
            "overall, 0.05 in every row and head")
RUN = "python3 with torch, flashinfer and a CUDA GPU (kernels build on first use); exits 1 when reproduced"
CONTROL = "the same plan with disable_split_kv=True"

MAIN = Template('''
def main():
    env = environment()  # before any call: a crash can take the CUDA context with it
    dev, bf16, i32 = torch.device(DEVICE), torch.bfloat16, torch.int32
    # swabench's inputs: the request's $pages pages shuffled, then N(0, 1) data from one seeded generator
    kv_indices = torch.randperm($pages, generator=torch.Generator().manual_seed($seed1)).to(i32)
    g = torch.Generator(dev).manual_seed($seed)
    q = torch.randn(($qo, $h, $d), generator=g, device=dev).to(bf16)
    k_cache, v_cache = (torch.randn(($pages, $ps, $hkv, $d), generator=g, device=dev).to(bf16) for _ in "kv")
    qo_indptr, kv_indptr, kv_last_page_len = (torch.tensor(v, dtype=i32) for v in ([0, $qo], [0, $pages], [$last]))
    keys = (kv_indices.long()[:, None] * $ps + torch.arange($ps)).flatten()[:$kv].to(dev)  # key j's slot
    expected, out = reference(q, k_cache.flatten(0, 1)[keys], v_cache.flatten(0, 1)[keys]), torch.empty_like(q)
    buffers = {name: torch.empty((n,), dtype=i32, device=dev) for name, n in (("qo_indptr_buf", 2),
               ("paged_kv_indptr_buf", 2), ("paged_kv_indices_buf", $pages), ("paged_kv_last_page_len_buf", 1))}
    workspace = torch.empty(($workspace,), dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2", use_cuda_graph=True,
                                                             **buffers)

    def plan(**control):  # uniform_q_len where the release takes it
        uniform = {"uniform_q_len": $qo} if "uniform_q_len" in inspect.signature(wrapper.plan).parameters else {}
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=$h, num_kv_heads=$hkv,
                     q_data_type=bf16, kv_data_type=bf16, sm_scale=$scale,
                     causal=False, window_left=$w, head_dim_qk=$d, page_size=$ps, **control, **uniform)

    def step():
        wrapper.run(q, (k_cache, v_cache), out=out)

    plan()
    wrong, what, worst = outcome(step, out, expected)
    verdict = "NOT REPRODUCED" if not wrong else "REPRODUCED (crash)" if what.startswith("crash") else "REPRODUCED"
    print(f"{verdict}: {what}", *worst, sep="\\n")
    plan(disable_split_kv=True)  # the control: the same plan, no request split along KV
    print("CONTROL, $control: " + outcome(step, out, expected)[1], *env, sep="\\n")
    return 1 if wrong else 0


def reference(q, k, v):
    """float32 softmax(scale q k^T) v, the query at key position i seeing keys j >= i - $w (no causal bound)."""
    k, v = (t.float().repeat_interleave($group, dim=1) for t in (k, v))
    i, j = torch.arange($start, $kv, device=q.device)[:, None], torch.arange($kv, device=q.device)
    s = (torch.einsum("qhd,khd->hqk", q.float(), k) * $scale).masked_fill(j < i - $w, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(dim=-1), v)


def outcome(step, out, expected):
    """(wrong, what, the worst row) of ``step``'s ``out`` (NaN first: a row it never writes is wrong)."""
    out.fill_(float("nan"))
    try:
        step()
        torch.cuda.synchronize()
    except RuntimeError as e:  # an illegal memory access or a launch failure: the call never finished
        return True, f"crash: {str(e).strip().splitlines()[0]}", []
    err, tol = (out.float() - expected).nan_to_num(nan=float("inf")), TOLERANCE
    head = err.norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-6)  # [row, head]: a row is wrong past row_rel_l2
    rel, row = float(err.norm() / expected.norm()), head.amax(dim=-1)
    said = f"rel-L2 {rel:.3g}, worst row {float(row.max()):.3g}; tolerances {tol['rel_l2']:g}, {tol['row_rel_l2']:g}"
    bad = set((row > tol["row_rel_l2"]).nonzero().flatten().tolist())
    if rel <= tol["rel_l2"] and not bad:
        return False, f"right ({said})", []
    spans = zip(sorted(r for r in bad if r - 1 not in bad), sorted(r for r in bad if r + 1 not in bad))
    rows = ", ".join(f"{a}-{z}" if z > a else f"{a}" for a, z in spans)
    w, h = int(row.argmax()), int(head[int(row.argmax())].argmax())
    values = [[round(x, 3) for x in t[w, h, :4].tolist()] for t in (expected, out.float())]
    return True, (f"request 0: rows {rows} wrong" if rows else "no row past the row tolerance") + f" ({said})", [
        f"worst: request 0 row {w}, head {h}, first values expected {values[0]}, got {values[1]}"]


def environment():
    """The GPU, torch and flashinfer, then FlashInfer's own report: the driver, CUDA, cubin and JIT-cache packages."""
    p = torch.cuda.get_device_properties(0)
    report = subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True)
    return [f"{p.name}: compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs; torch "
            f"{torch.__version__} (CUDA {torch.version.cuda})", f"flashinfer-python {flashinfer.__version__}",
            report.stdout.rstrip() or f"(python -m flashinfer.collect_env: exit {report.returncode}, no report)"]
''')


def header_lines(lines: list[str]) -> list[str]:
    """The traced scripts' top comment, cut: the title says what is wrong, and Fault where it is filed."""
    short = {"Expected": EXPECTED, "Run": RUN}
    return [f"{name}: {short[name]}" if name in short else f"{name}: {text}"
            for name, _, text in (line.partition(": ") for line in lines) if name not in ("What is wrong", "Upstream")]


def render(case, header: script.Header) -> str:
    """The script's text for ``case`` (one request, planned non-causal with its window) under ``header``."""
    qo, kv = workloads.request_lengths(case)
    if len(kv) != 1 or case.causal or case.window_left < 0 or case.storage != "paged" or \
            {case.dtype, case.cache_dtype} != {"bfloat16"}:
        raise ValueError(f"the two-screen script takes one paged bfloat16 request planned non-causal with a window, "
                         f"not {case.label}")
    ps = case.page_size
    pages = -(-kv[0] // ps)
    main = MAIN.substitute(qo=qo[0], kv=kv[0], start=kv[0] - qo[0], pages=pages, ps=ps, last=kv[0] - (pages - 1) * ps,
                           h=case.num_qo_heads, hkv=case.num_kv_heads, group=case.num_qo_heads // case.num_kv_heads,
                           d=case.head_dim, w=case.window_left, scale=case.scale, seed=case.seed, seed1=case.seed + 1,
                           workspace=WORKSPACE_BYTES, control=CONTROL)
    call = ("Call: flashinfer.BatchPrefillWithPagedKVCacheWrapper(backend='fa2', use_cuda_graph=True), then "
            f"plan(causal=False, window_left={case.window_left}, uniform_q_len={qo[0]}), run()")
    constants = [script.tolerance_line(case.dtype), 'DEVICE = "cuda"']
    imports = ["import inspect", "import subprocess", "", "import torch", "", "import flashinfer"]
    return script.assemble(header, [call, script.shape_line(script.case_literals(case))], imports, constants,
                           main.strip(), [])


def check(parts: list[Part], header: script.Header) -> None:
    """Drift where the script's calls are not the suite's on the same case: the checked call, then its control."""
    want, _ = verify.suite_calls(parts)
    got, _ = verify.script_calls(render(parts[0].case, header))
    verify.same_calls(want, got)
