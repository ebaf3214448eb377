"""A picture of where two blocks' bytes lie in a buffer: block 0 in blue,
block 1 in orange, everything else grey, padding white; beside it the same
for a remedy's layout. Interleaved blocks show as stripes spread through the
buffer, addressable ones as two solid runs."""

from __future__ import annotations

import numpy as np

import kvref
from probes.report import drawn
from probes.suite.ownership import PADDING, physical_owners

COLOURS = ("#d9d9d9", "#1f77b4", "#ff7f0e", "#9467bd", "#ffffff")  # other, block a, block b, both, padding
OTHER, FIRST, SECOND, BOTH, PAD = range(5)


def draw(shape: kvref.Shape, path, *, title: str = "", remedy: tuple[str, kvref.Shape] | None = None,
         blocks: tuple[int, int] = (0, 1), width: int = 256, lines: int = 128) -> None:
    """One column per layout (the shape's, then the remedy's): above, the whole
    buffer in `lines` lines of `width` pixels, each pixel a run of elements
    coloured by which of the two blocks own any of it; below, the same from
    the two blocks' first element to their last, or to as many elements as
    the panel shows one a pixel. Drawn only when one
    of these changed (probes.report.drawn)."""
    if shape.rank == 0 or shape.logical_elements == 0:
        raise ValueError(f"{shape} has no dim-0 rows to draw")
    if not (0 <= min(blocks) and max(blocks) < shape.dims[0]):
        raise ValueError(f"blocks {blocks} are not both among the {shape.dims[0]} blocks of {shape}")
    print_ = drawn.fingerprint(str(shape), title, remedy and (remedy[0], str(remedy[1])), blocks, width, lines)
    if drawn.present(path, print_):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    panels = [("as laid out", shape)] + ([remedy] if remedy else [])
    fig, axes = plt.subplots(2, len(panels), figsize=(6 * len(panels), 9), constrained_layout=True,
                             squeeze=False, height_ratios=(2, 1))
    for column, (label, layout) in enumerate(panels):
        owners = physical_owners(layout)
        held = np.flatnonzero(np.isin(owners, blocks))
        # Below, from the blocks' first element, at most one element a pixel: where whole runs
        # interleave, a coarser picture shows every pixel as "both".
        span = (int(held[0]), min(int(held[-1]) + 1, int(held[0]) + width * (lines // 2)))
        closer = "where they lie" if span[1] == int(held[-1]) + 1 else "from where they begin"
        for row, (part, where) in enumerate(((None, "whole buffer"),
                                             (span, f"elements {span[0]:,} to {span[1]:,}, {closer}"))):
            ax = axes[row][column]
            grid, step = block_grid(layout, blocks, width, lines if part is None else lines // 2, part, owners)
            ax.imshow(grid, cmap=ListedColormap(COLOURS), vmin=-0.5, vmax=len(COLOURS) - 0.5, aspect="auto",
                      interpolation="nearest")
            ax.set_xlabel(f"{where}: one pixel = {step:,} element(s), {width} per line", fontsize=8)
            ax.set_ylabel("line")
        reason = kvref.major_slice(layout).reason
        axes[0][column].set_title(f"{label}: {layout}\n"
                                  + ("blocks interleave" if reason else "each block one byte range"), fontsize=9)
    axes[0][0].legend(handles=[Patch(color=COLOURS[FIRST], label=f"block {blocks[0]}"),
                               Patch(color=COLOURS[SECOND], label=f"block {blocks[1]}"),
                               Patch(color=COLOURS[BOTH], label="both"),
                               Patch(color=COLOURS[OTHER], label="other blocks"),
                               Patch(facecolor=COLOURS[PAD], edgecolor="#999999", label="padding")],
                      loc="lower right", fontsize=8)
    fig.suptitle(title or f"{shape.key}: where blocks {blocks[0]} and {blocks[1]} lie", fontsize=10)
    drawn.save(fig, path, print_, dpi=100)
    plt.close(fig)


def block_grid(shape: kvref.Shape, blocks: tuple[int, int], width: int, lines: int,
               span: tuple[int, int] | None = None, owners: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """(lines x width codes, elements per pixel): which of the two blocks own
    any element of each pixel's run, else other data or padding; over the
    physical elements [span) (default: all)."""
    owners = physical_owners(shape) if owners is None else owners
    if span is not None:
        owners = owners[span[0]: span[1]]
    step = max(1, -(-owners.size // (width * lines)))
    runs = np.full(-(-owners.size // step) * step, PADDING, dtype=owners.dtype)
    runs[: owners.size] = owners
    runs = runs.reshape(-1, step)
    first, second = (runs == blocks[0]).any(1), (runs == blocks[1]).any(1)
    codes = np.where((runs == PADDING).all(1), PAD, OTHER)
    codes = np.where(first, FIRST, codes)
    codes = np.where(second, SECOND, codes)
    codes = np.where(first & second, BOTH, codes)
    grid = np.full(-(-codes.size // width) * width, PAD)
    grid[: codes.size] = codes
    return grid.reshape(-1, width), step
