"""The ranges of sm_scale and logits_soft_cap in which a case's numbers mean something in its dtype: the gate's
data stays finite and normal there, and so do the kernels' float32 scale, cap and logits.  Outside them a
correct path would "fail" the gate on numbers no dtype holds, so scenario validation refuses them instead.
Pure arithmetic, from the case's axes."""

from __future__ import annotations

from swabench.core.cases import Case

# (largest finite, smallest normal) of each query dtype, as torch.finfo gives them
FINFO = {"bfloat16": (3.3895313892515355e38, 1.1754943508222875e-38),
         "float16": (65504.0, 6.103515625e-05),
         "float32": (3.4028234663852886e38, 1.1754943508222875e-38)}
FLOAT32_MAX, FLOAT32_TINY = FINFO["float32"]  # the kernels take the scale and the cap, and hold logits, in float32
LOGIT_PER_DIM = 64  # |q.k| of the gate's N(0, 1) data stays under 64 * head_dim (six sigma a product, times log2 e)


def sm_scale_range(case: Case) -> tuple[float, float]:
    """The probes write queries of SCALE / sm_scale a feature over n features (the peak's shift is n of them): at
    the low end they, and their unscaled float32 logits q.k (a few n of them), stay finite; at the high end they
    stay normal, and the random data's float32 logits, sm_scale * q.k, finite."""
    from swabench.core import probes

    big, tiny = FINFO[case.dtype]
    largest = probes.SCALE * probes.frequencies_needed(case.largest()[1], case.window_left)
    low = max(largest / big, LOGIT_PER_DIM * largest / FLOAT32_MAX, FLOAT32_TINY)
    return low, min(probes.SCALE / tiny, FLOAT32_MAX / (LOGIT_PER_DIM * case.head_dim))


def soft_cap_range(case: Case) -> tuple[float, float]:
    """With a soft-cap the random queries' first feature is SOFT_CAP_LOGITS[0] * cap / sm_scale (the logits'
    mean): normal in the dtype, and the cap a normal float32 whose logits stay finite."""
    from swabench.core.workloads import SOFT_CAP_LOGITS

    big, tiny = FINFO[case.dtype]
    mean = SOFT_CAP_LOGITS[0] / case.scale
    return max(tiny / mean, FLOAT32_TINY), min(big / mean, FLOAT32_MAX / LOGIT_PER_DIM)


def out_of_range(case: Case) -> tuple[str, str] | None:
    """(field, why) where the case's sm_scale or logits_soft_cap lies outside its range, else None."""
    keys = case.largest()[1]
    low, high = sm_scale_range(case)
    if not low <= case.scale <= high:
        given = "" if case.sm_scale is not None else f" (head_dim {case.head_dim} ** -0.5)"
        return "sm_scale", (f"{case.scale:g}{given} is outside {low:.3g} to {high:.3g} for {case.dtype} queries at "
                            f"head_dim {case.head_dim} and {keys} keys: beyond it the gate's queries (8 nats / "
                            f"sm_scale a feature) leave {case.dtype}'s normal range, or the float32 logits overflow")
    if case.logits_soft_cap:
        low, high = soft_cap_range(case)
        if not low <= case.logits_soft_cap <= high:
            return "logits_soft_cap", (f"{case.logits_soft_cap:g} is outside {low:.3g} to {high:.3g} for "
                                       f"{case.dtype} queries at sm_scale {case.scale:.4g} (or 0 for none): beyond "
                                       f"it the gate's random queries (0.3 cap / sm_scale) leave {case.dtype}'s "
                                       f"normal range, or the kernels' float32 cap and logits do")
    return None
