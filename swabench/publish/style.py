"""The look every figure shares: one colour table of paths (a hue per path family, from the Okabe-Ito colours, which
are safe for colour-blind readers, and a shade and a marker per member), one line style per backend, the caption that
says where the numbers came from, and one PNG per figure at a width that reads in a pull request."""

from __future__ import annotations

import zlib
from pathlib import Path

import matplotlib
import matplotlib.ticker

from swabench.impls import registry
from swabench.publish import outputs
from swabench.publish.markdown import library_versions, short_commit
from swabench.publish.outputs import PNG_SOFTWARE

matplotlib.use("Agg")

OKABE_ITO = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]
BACKEND_STYLE = {"fa2": "-", "fa3": "--", "auto": ":", "torch": "-."}
BACKEND_COLOUR = {"fa2": OKABE_ITO[4], "fa3": OKABE_ITO[5], "auto": OKABE_ITO[6], "cudnn": OKABE_ITO[2]}


MARKERS = "osD^vXP*<>h"

# The one colour table of paths: a path family (the wrapper a path goes through; FlashInfer's Hopper kernels as one
# shelf; cuDNN and FlashAttention-4, backends beyond FlashInfer's wrappers; FlashAttention-3's two builds; else the
# library) has one hue, and its members shades of it, each with a marker of its own.
FAMILY_HUES = {"prefill": "#0072B2", "decode": "#D55E00", "sink": "#009E73", "recipe": "#CC79A7", "shelf": "#E69F00",
               "torch": "#555555", "flex": "#6A3D9A", "beyond": "#999933", "fa3": "#882255", "other": "#AAAAAA"}
FAMILY_OF_WRAPPER = {"xqa": "shelf", "trtllm-gen": "shelf", "ranges": "shelf", "fmha-v2": "shelf", "holistic": "shelf",
                     "pod": "shelf", "cudnn": "beyond", "fa4": "beyond", "vllm-fa3": "fa3", "sgl-fa3": "fa3"}
DARKEST, LIGHTEST = 0.18, 0.7  # the lightness a member's shade spans, dark enough to read on white
GOLDEN = 0.618034  # the k-th member's place in that span steps by it, so any few members lie apart


def family(impl: str) -> str:
    """The colour family of a path: its wrapper family as the registry declares it, the shelf's kernels as one."""
    if not registry.known(impl):
        return "other"
    wrapper = registry.get(impl).family
    return FAMILY_OF_WRAPPER.get(wrapper, wrapper if wrapper in FAMILY_HUES else "other")


def shade(colour: str, lightness: float) -> str:
    """``colour`` at ``lightness`` (0 black, 1 white), its hue and saturation kept."""
    import colorsys

    from matplotlib.colors import to_hex, to_rgb

    h, _, s = colorsys.rgb_to_hls(*to_rgb(colour))
    return to_hex(colorsys.hls_to_rgb(h, lightness, s))


def member_shade(k: int) -> float:
    """The lightness of a family's k-th member: the first a third of the way up the span, the next ones by golden-ratio
    steps, so that the members of a family that share a figure are rarely close."""
    return DARKEST + (LIGHTEST - DARKEST) * ((0.35 + GOLDEN * k) % 1.0)


def look(impl: str) -> dict:
    """The colour and marker of a path, the same in every figure: its family's hue (FAMILY_HUES) in its own shade, and
    a marker, both by its place among the family's registered members."""
    members = [name for name in registry.names() if family(name) == family(impl)]
    k = members.index(impl) if impl in members else len(members) + zlib.crc32(impl.encode()) % len(MARKERS)
    return {"color": shade(FAMILY_HUES[family(impl)], member_shade(k)), "marker": MARKERS[k % len(MARKERS)]}


ENGINE_COLOUR = {"FlashInfer": FAMILY_HUES["prefill"], "cuDNN": FAMILY_HUES["beyond"], "FlashAttention-4":
                 shade(FAMILY_HUES["beyond"], DARKEST), "FlashAttention-3 (vLLM)": shade(FAMILY_HUES["fa3"], 0.3),
                 "FlashAttention-3 (SGLang)": shade(FAMILY_HUES["fa3"], 0.6),
                 "FlexAttention": FAMILY_HUES["flex"]}  # an engine's backends


def legend_outside(fig, axes) -> None:
    """One legend for the figure, clear of its panels and its title: beside them, in two columns when it is
    long."""
    handles = {label: h for ax in axes.flat for h, label in zip(*ax.get_legend_handles_labels())}
    if handles:
        fig.legend(handles.values(), handles.keys(), fontsize=6, loc="outside right center",
                   ncol=2 if len(handles) > 14 else 1)


def caption(meta: dict) -> str:
    device = meta.get("gpu") or f"CPU ({meta.get('cpu')})"
    if meta.get("embedded_backend"):
        device += ", embedded PyTorch backend"
    commit = short_commit(meta, 8)
    l2 = "cold L2" if "flush" in str(meta.get("method", {}).get("kernel_time", "")) else ""
    return (f"{device} | {library_versions(meta)} | torch {meta.get('torch')} | "
            f"swabench {meta.get('swabench')}@{commit} | {meta.get('scenario')} | {l2}").rstrip(" |")


def pyplot():
    """pyplot, imported when a figure is drawn: every run imports this module, and pyplot alone
    takes a quarter of a second to import."""
    import matplotlib.pyplot as plt
    return plt


def figure(meta: dict, title: str, nrows=1, ncols=1, size=(7.0, 4.2), **layout):
    """A figure of ``nrows`` x ``ncols`` panels with its title and caption; ``layout`` goes to pyplot's subplots
    (e.g. gridspec_kw)."""
    fig, axes = pyplot().subplots(nrows, ncols, figsize=(size[0] * ncols ** 0.8, size[1] * nrows ** 0.8),
                                  squeeze=False, constrained_layout=True, **layout)
    fig.suptitle(title, fontsize=11)
    fig.text(0.5, -0.01, fill_caption(caption(meta), fig.get_figwidth()), ha="center", va="top", fontsize=7,
             color="#444444")
    return fig, axes


CAPTION_CHARS_PER_INCH = 17  # 7-point text: a caption wrapped at this many characters an inch stays inside the panels


def fill_caption(text: str, width_in: float) -> str:
    """The caption in lines no wider than the figure: one long line (many libraries, long build names) would widen
    the saved PNG and leave its panels adrift in white space."""
    import textwrap

    return textwrap.fill(text, width=max(40, int(width_in * CAPTION_CHARS_PER_INCH)), break_long_words=False)


def log_x_ticks(ax, values) -> None:
    """Log x axis labelled at the values measured, without the minor-tick clutter."""
    values = sorted(v for v in set(values) if v == v)
    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xticks(values, [f"{int(v)}" for v in values], fontsize=7)


PNG_WIDTH_PX = 1200  # reads at full size in a pull request or a browser, without zooming


def save(fig, out: Path, name: str) -> list[Path]:
    """``name``.png in ``out``: about PNG_WIDTH_PX wide, in a palette of 256 colours (a third of the
    bytes, the same to the eye) and with no timestamp inside, so the same run gives the same file."""
    import io

    from PIL import Image, PngImagePlugin

    dpi = min(200.0, max(90.0, PNG_WIDTH_PX / fig.get_size_inches()[0]))  # the tight box is a little narrower
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    image = Image.open(rendered).convert("RGB")
    path, png = out / f"{name}.png", io.BytesIO()
    tag = PngImagePlugin.PngInfo()
    tag.add_text("Software", PNG_SOFTWARE)  # how a command of an older release knew swabench wrote it
    image.quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(png, "PNG", optimize=True,
                                                                                         pnginfo=tag)
    outputs.keep(path, png.getvalue())  # by rename, only over a regular file, listed in a made-from record beside it
    return [path]
