"""Pictures for the reports: the verdict heatmap, and memory maps of the
smallest refused layouts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import kvref
from probes.report.explain import remedy_for
from probes.report import drawn, memory_map
from probes.report.paths import file_safe
from probes.report.results import agrees, implementation
from probes.suite.registry import PROBES, Scope
from probes.suite.verdicts import Verdict

VERDICT_COLOURS = {Verdict.PASS: "#4caf50", Verdict.REJECTED: "#90a4ae", Verdict.CORRUPT: "#e53935",
                   Verdict.HANG: "#8e24aa", Verdict.CRASH: "#000000", Verdict.ERROR: "#fb8c00",
                   Verdict.SKIP: "#ffffff"}
MAX_MEMORY_MAPS = 4
CELL_IN = 0.3  # a heatmap cell's side, in inches
OTHER_PROBES = "other probes"  # the panel of probes that do not run per shape
SEVERITY = (Verdict.SKIP, Verdict.PASS, Verdict.REJECTED, Verdict.ERROR, Verdict.CORRUPT, Verdict.HANG, Verdict.CRASH)


def draw_heatmap(frame: pd.DataFrame, path: Path, title: str) -> None:
    """Each case's verdict: a panel of shapes (rows) by the probes that run
    per shape (columns; per implementation, where there are several), then
    one of every other probe (rows) by implementation (columns), each cell
    its cases' most severe verdict and how many passed. A legend says the colours; "!"
    marks a verdict the prediction does not admit. Drawn only when what it
    shows changed."""
    names = implementation(frame)
    off = [agrees(v, p) is False for v, p in zip(frame["verdict"], frame["predicted"])]
    labelled = frame.assign(implementation=names, off=pd.Series(off, index=frame.index, dtype=bool))
    per_shape = labelled["probe"].isin([n for n, p in PROBES.items() if p.scope == Scope.SHAPE])
    order = {p: i for i, p in enumerate(PROBES)}
    panels = []
    shaped = labelled[per_shape]
    if len(shaped):
        several = shaped["implementation"].nunique() > 1
        shaped = shaped.assign(column=shaped["probe"] + (" / " + shaped["implementation"] if several else ""))
        grid = shaped.pivot_table(index="shape", columns="column", values="verdict", aggfunc="first")
        grid = grid[sorted(grid.columns, key=lambda c: (order.get(c.split(" / ")[0], 99), c))]
        off = set(shaped[shaped["off"]].set_index(["shape", "column"]).index)
        cells = [[(v, "!" if (r, c) in off else "") if isinstance(v, str) else None for r, v in column.items()]
                 for c, column in grid.items()]  # shapes across, so that many shapes make it wide, not tall
        panels.append(("probes per shape", list(grid.columns), list(grid.index), cells))
    rest = labelled[~per_shape]
    if len(rest):
        probes = sorted(rest["probe"].unique(), key=lambda p: (order.get(p, 99), p))
        columns = sorted(rest["implementation"].unique())
        cells = [[_summed(rest[(rest["probe"] == p) & (rest["implementation"] == c)]) for c in columns]
                 for p in probes]
        panels.append((f"{OTHER_PROBES}:\nmost severe verdict, passed/run", probes, columns, cells))
    print_ = drawn.fingerprint(title, panels)
    if drawn.present(path, print_):
        return
    _draw_panels(panels, path, title, print_)


def _summed(cases: pd.DataFrame):
    """A cell of the other probes' panel: (the most severe verdict, "passed/run" and "!" where one disagrees)."""
    if not len(cases):
        return None
    worst = max(cases["verdict"], key=lambda v: SEVERITY.index(Verdict(v)))
    passed = int((cases["verdict"].isin([Verdict.PASS, Verdict.REJECTED])).sum())
    return worst, f"{passed}/{len(cases)}" + ("!" if cases["off"].any() else "")


def _draw_panels(panels, path: Path, title: str, print_: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    # Side by side, each as wide as its columns (cells that carry counts twice as wide): a screen is wide.
    widths = [CELL_IN * max(len(columns) * (2 if name.startswith(OTHER_PROBES) else 1), 8)
              for name, _, columns, _ in panels]
    tallest = max(len(rows) for _, rows, _, _ in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(2.5 * len(panels) + sum(widths), 3.2 + CELL_IN * tallest),
                             gridspec_kw={"width_ratios": widths}, constrained_layout=True, squeeze=False)
    cmap = ListedColormap([VERDICT_COLOURS[v] for v in Verdict])
    codes = {v: i for i, v in enumerate(Verdict)}
    for ax, (name, rows, columns, cells) in zip(axes[0], panels):
        grid = [[codes[Verdict(c[0])] if c else float("nan") for c in row] for row in cells]
        summed = name.startswith(OTHER_PROBES)  # cells that carry counts: twice as wide
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(Verdict) - 0.5, aspect=0.5 if summed else "equal")
        ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        for i, row in enumerate(cells):
            for j, cell in enumerate(row):
                if cell and cell[1]:
                    dark = Verdict(cell[0]) in (Verdict.CRASH, Verdict.HANG, Verdict.CORRUPT)
                    ax.text(j, i, cell[1], ha="center", va="center", fontsize=6 if len(cell[1]) > 1 else 8,
                            fontweight="bold", color="white" if dark else "black")
        off = sum(1 for row in cells for c in row if c and c[1].endswith("!"))
        ax.set_title(f"{name}\n{off} cells disagree", fontsize=9, loc="left")
    fig.legend(handles=[Patch(facecolor=VERDICT_COLOURS[v], edgecolor="#555555", label=str(v)) for v in Verdict]
               + [Patch(facecolor="none", edgecolor="none", label="! disagrees with the prediction")],
               loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
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
    for old in set(gen_dir.glob("memory-map-*.png")) - set(paths):  # an earlier run's: the report links none
        old.unlink()
    return paths


def layout_reason(layout_text: str) -> str:
    """Why a layout's dim-0 rows are not contiguous ("" when they are)."""
    return kvref.major_slice(kvref.Shape.parse(layout_text)).reason
