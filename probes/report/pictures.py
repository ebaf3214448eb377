"""Pictures for the reports: the verdict heatmap, and memory maps of the
smallest refused layouts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import kvref
from probes.report.explain import remedy_for
from probes.report import drawn, memory_map
from probes.report.paths import file_safe
from probes.report.results import implementation
from probes.suite.registry import PROBES, Scope
from probes.suite.verdicts import Verdict

VERDICT_COLOURS = {Verdict.PASS: "#4caf50", Verdict.REJECTED: "#90a4ae", Verdict.CORRUPT: "#e53935",
                   Verdict.HANG: "#8e24aa", Verdict.CRASH: "#000000", Verdict.ERROR: "#fb8c00",
                   Verdict.SKIP: "#ffffff"}
MAX_MEMORY_MAPS = 4


def draw_heatmap(frame: pd.DataFrame, path: Path, title: str) -> None:
    """Each case's verdict, a row per shape (or kind of input) and a column
    per probe (and implementation); drawn only when the grid or title changed."""
    names = implementation(frame)
    several = names.nunique() > 1
    # Shape probes are rows by shape; robustness probes by their kind of input.
    by_kind = frame["case_id"].str.rsplit("/", n=1).str[1]
    robustness = frame["probe"].isin([n for n, p in PROBES.items() if p.scope == Scope.ROBUSTNESS])
    labelled = frame.assign(row=frame["shape"].where(~robustness, by_kind),
                            column=frame["probe"] + (" / " + names if several else ""))
    grid = labelled.pivot_table(index="row", columns="column", values="verdict", aggfunc="first")
    order = {p: i for i, p in enumerate(PROBES)}
    grid = grid[sorted(grid.columns, key=lambda c: (order.get(c.split(" / ")[0], 99), c))]
    cells = [[str(v) if isinstance(v, str) else None for v in row] for row in grid.to_numpy().tolist()]
    print_ = drawn.fingerprint(title, list(grid.index), list(grid.columns), cells)
    if drawn.present(path, print_):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    codes = grid.apply(lambda col: col.map({v: i for i, v in enumerate(Verdict)}))
    fig, ax = plt.subplots(figsize=(2 + 1.3 * len(grid.columns), 1 + 0.28 * len(grid)),
                           constrained_layout=True)
    cmap = ListedColormap([VERDICT_COLOURS[v] for v in Verdict])
    ax.imshow(codes.to_numpy(dtype=float), cmap=cmap, vmin=-0.5, vmax=len(Verdict) - 0.5,
              aspect="auto")
    ax.set_xticks(range(len(grid.columns)), grid.columns, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(grid.index)), grid.index, fontsize=7)
    for (i, j), verdict in pd.DataFrame(grid.to_numpy()).stack().items():
        if not isinstance(verdict, str):
            continue  # this probe does not run on this shape
        ax.text(j, i, verdict, ha="center", va="center", fontsize=6,
                color="white" if verdict in (Verdict.CRASH, Verdict.HANG) else "black")
    ax.set_title(title, fontsize=10)
    drawn.save(fig, path, print_, dpi=90)
    plt.close(fig)


def draw_refused_maps(frame: pd.DataFrame, gen_dir: Path) -> list[Path]:
    """Memory maps of the smallest few refused layouts, one per reason kind,
    each beside its cheapest remedy's layout where the compiler agreed to one."""
    generation = frame["generation"].iloc[0]
    refused = frame[(frame["verdict"] == Verdict.REJECTED) & (frame["probe"] == "roundtrip")]
    refused = refused.drop_duplicates("layout").sort_values("physical_bytes")
    paths, seen = [], set()
    for text in refused["layout"]:
        shape = kvref.Shape.parse(text)
        kind = layout_reason(text).split(":")[0].split(",")[0]
        if kind in seen:
            continue
        seen.add(kind)
        path = gen_dir / f"memory-map-{file_safe(text)}.png"
        remedy, _ = remedy_for(shape, None if generation == "cpu" else generation)
        memory_map.draw(shape, path, title=layout_reason(text),
                        remedy=(f"remedy: {remedy.change}", remedy.shape) if remedy else None)
        paths.append(path)
        if len(paths) == MAX_MEMORY_MAPS:
            break
    return paths


def layout_reason(layout_text: str) -> str:
    """Why a layout's dim-0 rows are not contiguous ("" when they are)."""
    return kvref.major_slice(kvref.Shape.parse(layout_text)).reason
