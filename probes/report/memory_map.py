"""A picture of a buffer's physical bytes, each coloured by the dim-0 row that
owns it, so rows interleaving inside tiles are visible at a glance."""

from __future__ import annotations

import numpy as np

import kvref
from probes.suite.ownership import PADDING, physical_owners


def draw(shape: kvref.Shape, path, *, title: str = "", width: int = 256, detail_rows: int = 64) -> None:
    """Two panels: the first `detail_rows` x `width` elements element by element,
    and the whole buffer with each pixel a run of elements (coloured by the row
    owning its first element)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if shape.rank == 0 or shape.logical_elements == 0:
        raise ValueError(f"{shape} has no dim-0 rows to draw")
    owners = physical_owners(shape)
    detail = _grid(owners[: width * detail_rows], width)
    step = max(1, -(-owners.size // (width * 256)))
    overview = _grid(owners[::step], width)

    fig, axes = plt.subplots(1, 2, figsize=(12, 6), constrained_layout=True)
    cmap = plt.get_cmap("tab20").with_extremes(bad="#dddddd")
    for ax, grid, label in (
        (axes[0], detail, f"first {detail.size:,} elements, one pixel each"),
        (axes[1], overview, f"whole buffer, one pixel per {step:,} elements"),
    ):
        masked = np.ma.masked_less(grid, 0)
        ax.imshow(masked % 20, cmap=cmap, vmin=0, vmax=19, aspect="auto", interpolation="nearest")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(f"element within a line of {width}")
        ax.set_ylabel("line")
    fig.suptitle((title + "\n" if title else "") + f"{shape}: colour = owning dim-0 row "
                 "(mod 20), grey = padding", fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _grid(values: np.ndarray, width: int) -> np.ndarray:
    rows = -(-values.size // width)
    grid = np.full(rows * width, PADDING - 1, dtype=np.int64)  # beyond the buffer
    grid[: values.size] = values
    return grid.reshape(rows, width)
