"""Reports per TPU generation from probe results: summary.md, a verdict
heatmap, memory maps of refused layouts, and reports/README.md side by side."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import kvref
from probes import memory_map
from probes.cases import PROBES, ROBUSTNESS_PROBES
from probes.verdicts import VERDICTS, disagreements, skipped

VERDICT_COLOURS = {"PASS": "#4caf50", "REJECTED": "#90a4ae", "CORRUPT": "#e53935", "HANG": "#8e24aa",
                   "CRASH": "#000000", "ERROR": "#fb8c00", "SKIP": "#ffffff"}
MAX_MEMORY_MAPS = 4


def write_generation_report(frame: pd.DataFrame, gen_dir: Path) -> Path:
    gen_dir.mkdir(parents=True, exist_ok=True)
    gen = frame["generation"].iloc[0]
    heatmap = gen_dir / "verdicts.png"
    draw_heatmap(frame, heatmap, f"{gen}: verdict per case")
    maps = draw_refused_maps(frame, gen_dir)
    lines = [f"# {gen} ({frame['device_kind'].iloc[0] or 'unknown device'})", "",
             f"Run `{frame['run_id'].iloc[0]}` of {frame['iut'].iloc[0]} "
             f"{frame['iut_version'].iloc[0]} ({frame['backend'].iloc[0]}), "
             f"{len(frame)} cases; layouts from {frame['layout_source'].iloc[0]}."
             + (f" Faults: `{frame['faults'].iloc[0]}`." if frame["faults"].iloc[0] else ""), "",
             "## Verdicts by probe", "", _counts(frame, "probe"), "",
             "## Verdicts by dtype", "", _counts(frame, "dtype"), "",
             f"![verdicts]({heatmap.name})", ""]
    if frame["iut"].nunique() > 1:
        lines += side_by_side(frame)
    disagree, skips = disagreements(frame), skipped(frame)
    tested = len(frame) - len(skips)
    lines += ["## Disagreements with the reference's prediction", ""]
    if len(disagree):
        lines += [_table(disagree[["case_id", "layout", "predicted", "verdict", "detail"]]), ""]
    else:
        lines += [f"None: each of the {tested} cases that ran earned the verdict the reference "
                  "predicts." if tested else "None ran: every case was skipped.", ""]
    if len(skips):
        reasons = skips.groupby("detail", sort=False).size().rename("cases").reset_index()
        lines += ["## Skipped", "", "Cases that could not run here, so were not tested.", "",
                  _table(reasons.rename(columns={"detail": "reason"})), ""]
    refused = frame[(frame["verdict"] == "REJECTED") & (frame["probe"] == "roundtrip")]
    lines += ["## Refused shapes", "",
              "Shapes whose dim-0 blocks are not contiguous byte ranges on this generation.", ""]
    if len(refused):
        reasons = refused.assign(reason=[_reason(t) for t in refused["layout"]])
        lines += [_table(reasons[["dtype", "dims", "layout", "legacy_slice_bytes", "reason"]]), ""]
    lines += [f"![memory map]({p.name})" for p in maps] + [""]
    path = gen_dir / "summary.md"
    path.write_text("\n".join(lines))
    return path


def write_index(frames: dict[str, pd.DataFrame], out: Path) -> Path:
    """reports/README.md: every generation side by side (a run of several
    implementations gets one column each)."""
    links = " | ".join(f"[{g}]({g}/summary.md)" for g in frames)
    frames = {(gen if f["iut"].nunique() == 1 else f"{gen} {iut}"): part
              for gen, f in frames.items() for iut, part in f.groupby("iut", sort=False)}
    counts = pd.DataFrame({gen: f["verdict"].value_counts() for gen, f in frames.items()})
    counts = counts.reindex([v for v in VERDICTS if v in counts.index]).fillna(0).astype(int)
    shapes = pd.concat([f.assign(column=name) for name, f in frames.items()])
    shapes = shapes[shapes["probe"] == "roundtrip"]
    side = shapes.pivot_table(index=["dtype", "dims"], columns="column", values="verdict",
                              aggfunc="first").reindex(columns=list(frames)).fillna("-")
    lines = ["# kvprobe reports", "",
             "Per-generation results of the default probe run; each links to its summary.", "",
             links, "",
             "## Verdict counts", "", _table(counts.reset_index(names="verdict")), "",
             "## Per-block round trip, shape by shape", "",
             "REJECTED: the layout puts blocks inside tiles, so no manager may move them as "
             "byte ranges.", "", _table(side.reset_index()), ""]
    tpu = [name for name in frames if name in kvref.GENERATIONS]
    layouts = shapes.pivot_table(index=["dtype", "dims"], columns="column", values="layout",
                                 aggfunc="first").reindex(columns=tpu)
    differing = layouts[layouts.nunique(axis=1) > 1]
    if len(differing):
        lines += ["## Layouts that differ between generations", "",
                  _table(differing.reset_index()), ""]
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path


def draw_heatmap(frame: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    several = frame["iut"].nunique() > 1
    # Shape probes are rows by shape; robustness probes by their kind of input.
    by_shape = frame["dtype"] + "[" + frame["dims"] + "]"
    by_kind = frame["case_id"].str.rsplit("/", n=1).str[1]
    labelled = frame.assign(row=by_shape.where(~frame["probe"].isin(ROBUSTNESS_PROBES), by_kind),
                            column=frame["probe"] + (" / " + frame["iut"] if several else ""))
    grid = labelled.pivot_table(index="row", columns="column", values="verdict", aggfunc="first")
    order = {p: i for i, p in enumerate(PROBES)}
    grid = grid[sorted(grid.columns, key=lambda c: (order.get(c.split(" / ")[0], 99), c))]
    codes = grid.apply(lambda col: col.map({v: i for i, v in enumerate(VERDICTS)}))
    fig, ax = plt.subplots(figsize=(2 + 1.3 * len(grid.columns), 1 + 0.28 * len(grid)),
                           constrained_layout=True)
    cmap = ListedColormap([VERDICT_COLOURS[v] for v in VERDICTS])
    ax.imshow(codes.to_numpy(dtype=float), cmap=cmap, vmin=-0.5, vmax=len(VERDICTS) - 0.5,
              aspect="auto")
    ax.set_xticks(range(len(grid.columns)), grid.columns, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(grid.index)), grid.index, fontsize=7)
    for (i, j), verdict in pd.DataFrame(grid.to_numpy()).stack().items():
        if not isinstance(verdict, str):
            continue  # this probe does not run on this shape
        ax.text(j, i, verdict, ha="center", va="center", fontsize=6,
                color="white" if verdict in ("CRASH", "HANG") else "black")
    ax.set_title(title, fontsize=10)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def draw_refused_maps(frame: pd.DataFrame, gen_dir: Path) -> list[Path]:
    """Memory maps of the smallest few refused layouts, one per reason kind."""
    refused = frame[(frame["verdict"] == "REJECTED") & (frame["probe"] == "roundtrip")]
    refused = refused.drop_duplicates("layout").sort_values("physical_bytes")
    paths, seen = [], set()
    for text in refused["layout"]:
        shape = kvref.Shape.parse(text)
        kind = _reason(text).split(":")[0].split(",")[0]
        if kind in seen:
            continue
        seen.add(kind)
        path = gen_dir / f"memory-map-{_file_name(text)}.png"
        memory_map.draw(shape, path, title=_reason(text))
        paths.append(path)
        if len(paths) == MAX_MEMORY_MAPS:
            break
    return paths


def _reason(layout_text: str) -> str:
    return kvref.major_slice(kvref.Shape.parse(layout_text)).reason


def _counts(frame: pd.DataFrame, by: str) -> str:
    table = pd.crosstab(frame[by], frame["verdict"])
    return _table(table.reindex(columns=[v for v in VERDICTS if v in table.columns]).reset_index())


def _table(frame: pd.DataFrame) -> str:
    clean = frame.copy()
    for col in clean.columns:
        if clean[col].dtype == object:
            clean[col] = clean[col].map(lambda v: str(v).replace("\n", " ").replace("|", "/")[:300])
    return clean.to_markdown(index=False)


def _file_name(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


def side_by_side(frame: pd.DataFrame) -> list[str]:
    """Each case's verdict per implementation, and every case where they differ."""
    table = frame.pivot_table(index="case_id", columns="iut", values="verdict", aggfunc="first")
    details = frame.pivot_table(index="case_id", columns="iut", values="detail", aggfunc="first")
    differ = table[table.nunique(axis=1) > 1]
    lines = ["## Side by side", "", _table(table.reset_index()), "",
             "## Where the implementations disagree", ""]
    if differ.empty:
        return lines + ["Nowhere: every case earned the same verdict.", ""]
    for case_id in differ.index:
        lines += [f"### {case_id}", ""]
        for iut in table.columns:
            lines.append(f"- **{iut}**: {table.at[case_id, iut]}: "
                         f"{str(details.at[case_id, iut]).strip()[:1500]}")
        lines.append("")
    return lines
