"""Why a timing differs from an outside figure: one case through FlashInfer's wrapper modes.

The measurement issue's check point (verify, 32 requests x (8192 prefix + 16 draft), W = 1023,
page 16, fa2, bf16, 8/2 heads, d128) through paged-window and paged-mask, each gated, then timed
with the suite's CUDA-graph timer in cold and warm L2, for three ways of building the wrapper:
CUDA-graph mode with and without the uniform_q_len plan hint, and a plain (non-graph) wrapper
whose run() is still captured (legal while nothing re-plans).  Usage: python scripts/wrapper_modes.py [OUT.csv]
"""

import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CASE = dict(mode="verify", batch_size=32, prefix_len=8192, draft_tokens=16, window_left=1023, page_size=16,
            num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype="bfloat16")
MODES = {"cuda-graph": dict(graph_wrapper=True, uniform_hint=False),
         "cuda-graph + uniform_q_len": dict(graph_wrapper=True, uniform_hint=True),
         "plain": dict(graph_wrapper=False, uniform_hint=False)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", type=Path, metavar="OUT.csv", help="also write the table here")
    args = parser.parse_args(argv)
    from swabench.errors import UserError
    from swabench.store import paths, run_folder

    try:
        if args.out:
            paths.file_out(args.out, "OUT.csv")
    except UserError as e:
        parser.error(str(e))
    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None:
        parser.error("runs on a GPU node: needs a CUDA device and flashinfer")
    import pandas as pd

    from swabench.core import gate, workloads
    from swabench.impls import flashinfer_impls as fi
    from swabench.inputs import axes
    from swabench.measure import timing

    w = workloads.build(axes.make_case(CASE), "cuda")
    rows = []
    for impl, variant in {"paged-window": fi.Variant("paged"), "paged-mask": fi.Variant("paged", mask=True)}.items():
        for mode, kw in MODES.items():
            runner = fi.FlashInferRunner(w, "fa2", variant, **kw)
            runner.plan()
            result = gate.check(runner, w)
            for l2 in ("cold", "warm"):
                kernel, eager = timing.cuda_graph_time(runner.run, timing.GraphTimerOptions(l2=l2))
                rows.append(dict(impl=impl, wrapper=mode, l2=l2, passed=result.passed, rel_l2=result.rel_l2,
                                 median_us=kernel.median_us, noise=kernel.noise, eager_us=eager.median_us))
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    if args.out:
        run_folder.atomic_write(args.out, table.to_csv(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
