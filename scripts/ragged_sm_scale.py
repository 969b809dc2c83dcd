"""ragged-window (and paged-window) at 32/16 heads with sm_scale = 144 ** -0.5, each setting alone:
with and without the scale, the uniform_q_len hint, and GQA groups 2, 4 and 4 at 8/2 heads, gated on
fa2 and fa3.  Run when the GPU serving test first saw rel-L2 3.8 on ragged-window there: every
setting passed here, and the failure was the test's own (it gave ragged-window a paged workload, a
mismatch the registry now refuses as a skip).  Kept as the check that settles such a question.
Usage on the GPU node: python scripts/ragged_sm_scale.py"""

import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASE = dict(mode="verify", draft_tokens=8, batch_size=4, prefix_len=5000, sliding_window=4096, head_dim=128,
            dtype="bfloat16", storage="ragged")
VARIANTS = [  # (label, axes, uniform_q_len hint, storage)
    ("32/16 scale 1/12", dict(num_qo_heads=32, num_kv_heads=16, sm_scale=144 ** -0.5), True, "ragged"),
    ("32/16 scale 1/12, no hint", dict(num_qo_heads=32, num_kv_heads=16, sm_scale=144 ** -0.5), False, "ragged"),
    ("32/16 default scale", dict(num_qo_heads=32, num_kv_heads=16), True, "ragged"),
    ("32/16 default scale, no hint", dict(num_qo_heads=32, num_kv_heads=16), False, "ragged"),
    ("32/8 scale 1/12", dict(num_qo_heads=32, num_kv_heads=8, sm_scale=144 ** -0.5), True, "ragged"),
    ("8/2 scale 1/12", dict(num_qo_heads=8, num_kv_heads=2, sm_scale=144 ** -0.5), True, "ragged"),
    ("32/16 scale 1/12, paged", dict(num_qo_heads=32, num_kv_heads=16, sm_scale=144 ** -0.5), True, "paged"),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None:
        parser.error("runs on a GPU node: needs a CUDA device and flashinfer")
    from swabench.core import gate, workloads
    from swabench.impls import flashinfer_impls as fi
    from swabench.inputs import axes

    for label, fields, hint, storage in VARIANTS:
        for backend in ("fa2", "fa3"):
            w = workloads.build(axes.make_case({**BASE, **fields, "storage": storage}), "cuda")
            runner = fi.FlashInferRunner(w, backend, fi.Variant(storage), uniform_hint=hint)
            runner.plan()
            result = gate.check(runner, w)
            print(f"{label:32s} {backend}  passed={result.passed}  rel_l2={result.rel_l2:.3g}  "
                  f"probe={result.probe_rel_l2:.3g}  {result.reason[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
