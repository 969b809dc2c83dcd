"""The look every figure shares: Okabe-Ito colours (safe for colour-blind readers), one colour per
implementation and one line style per backend, the caption that says where the numbers came from,
and one PNG per figure at a width that reads in a pull request."""

from __future__ import annotations

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
ENGINE_COLOUR = {"FlashInfer": OKABE_ITO[0], "cuDNN": BACKEND_COLOUR["cudnn"], "FlashAttention-4": OKABE_ITO[1],
                 "FlexAttention": OKABE_ITO[3]}  # the backends an engine picks among (publish.sections.backends)


MARKERS = "osD^vXP*<>hp"  # with the eight colours, a look of its own for each of 96 implementations


def look(impl: str) -> dict:
    """The colour and marker of an implementation, the same in every figure that uses it: eight colours
    by its place in the registry, then a marker per eight, so no two registered paths share both."""
    i = registry.order(impl)
    return {"color": OKABE_ITO[i % len(OKABE_ITO)], "marker": MARKERS[(i // len(OKABE_ITO)) % len(MARKERS)]}


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


def figure(meta: dict, title: str, nrows=1, ncols=1, size=(7.0, 4.2)):
    fig, axes = pyplot().subplots(nrows, ncols, figsize=(size[0] * ncols ** 0.8, size[1] * nrows ** 0.8),
                             squeeze=False, constrained_layout=True)
    fig.suptitle(title, fontsize=11)
    fig.text(0.5, -0.01, caption(meta), ha="center", va="top", fontsize=7, color="#444444")
    return fig, axes


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
