"""Reports per TPU generation from probe results: summary.md (with the
pictures of probes.report.pictures) and reports/README.md side by side."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pandas as pd

import kvref
from probes.report.atomic import write_text_whole
from probes.report.explain import remedy_for, remedy_text
from probes.report.pictures import draw_heatmap, draw_refused_maps, layout_reason
from probes.report.provenance import which_code
from probes.report.results import disagreements, implementation, skipped
from probes.suite.registry import PROBES
from probes.suite.verdicts import WATCHDOG_FIRED, Verdict


def not_applicable(iuts, two_process_ran=()) -> list[str]:
    """The probes each IUT declares it cannot exercise, and why: never run, so
    neither passed nor skipped. `two_process_ran`: the IUTs whose
    two-process cases ran (on a TPU, a host whose chips each process held
    one of)."""
    from probes.iut import IUTError, iut
    from probes.suite.matrix import not_applicable as inapplicable

    rows = []
    for name in iuts:
        chips = 2 if name in two_process_ran else None
        try:
            rows += [{"iut": name, "probe": probe, "why": why} for probe, why in inapplicable(iut(name), chips)]
        except IUTError:  # an outside IUT no longer installed: its rows still report
            continue
    if not rows:
        return []
    return ["## Probes that do not apply", "", "Declared by each IUT, so never run for it.", "",
            _table(pd.DataFrame(rows)), ""]


def write_generation_report(frame: pd.DataFrame, gen_dir: Path) -> Path:
    gen_dir.mkdir(parents=True, exist_ok=True)
    frame = frame.assign(implementation=implementation(frame))
    gen = frame["generation"].iloc[0]
    tested = frame.drop_duplicates("implementation")
    who = ", ".join(f"{r.implementation} {r.iut_version} ({r.backend})" for r in tested.itertuples())
    heatmap = gen_dir / "verdicts.png"
    draw_heatmap(frame, heatmap, f"{gen}: verdict per case")
    maps = draw_refused_maps(frame, gen_dir)
    lines = [f"# {gen} ({frame['device_kind'].iloc[0] or 'unknown device'})", "",
             f"Run `{frame['run_id'].iloc[0]}` of {who}, "
             f"{len(frame)} cases; layouts from {frame['layout_source'].iloc[0]}."
             + (f" Faults: `{frame['faults'].iloc[0]}`." if frame["faults"].iloc[0] else ""), "",
             "## Verdicts by probe", "", _counts(frame, "probe"), "",
             "## Verdicts by dtype", "", _counts(frame, "dtype"), "",
             f"![verdicts]({heatmap.name})", ""]
    if frame["implementation"].nunique() > 1:
        lines += side_by_side(frame)
    disagree, skips = disagreements(frame), skipped(frame)
    tested = len(frame) - len(skips)
    lines += ["## Disagreements with the reference's prediction", ""]
    if len(disagree):
        lines += [_table(disagree.assign(layout=shard_layouts(disagree))[["case_id", "layout", "predicted",
                                                                          "verdict", "detail"]]), ""]
    else:
        lines += [f"None: each of the {tested} cases that ran earned the verdict the reference "
                  "predicts." if tested else "None ran: every case was skipped.", ""]
    if len(skips):
        reasons = skips.groupby("detail", sort=False).size().rename("cases").reset_index()
        lines += ["## Skipped", "", "Cases that could not run here, so were not tested.", "",
                  _table(reasons.rename(columns={"detail": "reason"})), ""]
    refused = frame[(frame["verdict"] == Verdict.REJECTED) & (frame["probe"] == "roundtrip")]
    lines += ["## Refused shapes", "",
              "Shapes whose dim-0 blocks are not contiguous byte ranges on this generation, each with the "
              "cheapest change this generation's compiler agreed makes them so (its memory against the "
              "shape's; a sharded cache's is for one device's shard).", ""]
    if len(refused):
        layouts = refused.drop_duplicates("layout")
        reasons = layouts.assign(reason=[layout_reason(t) for t in layouts["layout"]],
                                 remedy=[remedy_cell(t, gen) for t in layouts["layout"]])
        lines += [_table(reasons.assign(layout=shard_layouts(reasons))[["shape", "layout", "reason", "remedy"]]), ""]
    lines += [f"![memory map]({p.name})" for p in maps] + [""]
    lines += pulls_between_managers(frame)
    lines += not_applicable(frame["iut"].unique(), set(two_process_rows(frame)["iut"]))
    lines += findings(gen_dir)
    path = gen_dir / "summary.md"
    write_text_whole(path, "\n".join(lines))
    return path


def two_process_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["probe"].isin([name for name, p in PROBES.items() if p.two_process])]


def pulls_between_managers(frame: pd.DataFrame) -> list[str]:
    """The two-process probes' verdicts, and each landed pull's bytes per
    second against a plain copy of the same bytes timed beside it."""
    pulls = two_process_rows(frame)
    if pulls.empty:
        return []
    verdicts = pulls.pivot_table(index="case_id", columns="implementation", values="verdict", aggfunc="first")
    lines = ["## Transfers between managers", "",
             "Each case ran as a producer and a consumer worker, each with its own manager, connected only "
             "through loopback.", "", _table(verdicts.reset_index()), ""]
    timed = pulls[pulls["gbps"].notna() & pulls["baseline_gbps"].notna()]
    if len(timed):
        table = timed.assign(pull_gbps=timed["gbps"].round(3), copy_gbps=timed["baseline_gbps"].round(2),
                             pull_per_copy=(timed["gbps"] / timed["baseline_gbps"]).round(4))
        lines += ["Pulls that landed: bytes moved (every layer and part), GB/s from start_read to its done "
                  "report, and np.copyto of as many bytes in the consumer's process, timed in the same run.", "",
                  _table(table[["case_id", "implementation", "bytes_moved", "pull_gbps", "copy_gbps",
                                "pull_per_copy"]]), ""]
    return lines


def remedy_cell(layout_text: str, generation: str) -> str:
    if generation == "cpu":
        return "-"
    return remedy_text(*remedy_for(kvref.Shape.parse(layout_text), generation))


def findings(gen_dir: Path) -> list[str]:
    """What <generation>/findings/ keeps: hand-written reproducers, each with
    the first paragraph of its docstring, and findings kept as data (JSON),
    each with its verdict and reason."""
    scripts = sorted((gen_dir / "findings").glob("*.py"))
    kept = sorted((gen_dir / "findings").glob("*.json"))
    if not scripts and not kept:
        return []
    lines = ["## Findings", "", "Each fails the same way when run alone: a script (`python findings/NAME.py`), or "
             "a finding kept as data, replayed with `kvprobe fuzz --replay` (a contract sequence) or rendered as "
             "a standalone script with `kvprobe fuzz --reproducer findings/NAME.json`.", ""]
    for script in scripts:
        summary = ast.get_docstring(ast.parse(script.read_text())) or ""
        lines.append(f"- [`{script.name}`](findings/{script.name}): {' '.join(summary.split(chr(10) + chr(10))[0].split())}")
    for path in kept:
        try:
            finding = json.loads(path.read_text())
            said = f"{finding['iut']}: {finding['verdict']}: {finding['detail'].splitlines()[0] if finding['detail'] else ''}"
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            said = f"not a readable finding ({type(e).__name__})"
        lines.append(f"- [`{path.name}`](findings/{path.name}): {' '.join(said.split())[:400]}")
    return lines + [""]


def write_run_json(frame: pd.DataFrame, files: list[Path], out: Path) -> Path:
    """<out>/summary.json: one run as a CI job or a dashboard reads it: its
    id, which code ran it, counts per verdict, the cases that disagree with their prediction,
    and the files the run wrote."""
    disagree = disagreements(frame)
    summary = {
        "run_id": str(frame["run_id"].iloc[0]) if len(frame) else "",
        "kvprobe": which_code(),  # the code that ran: the same command runs a source tree or an installed copy
        "cases": len(frame),
        "verdicts": {str(v): int(n) for v, n in frame["verdict"].value_counts().sort_index().items()},
        "disagreements": [{key: str(row[key]) for key in ("generation", "iut", "iut_options", "case_id", "verdict",
                                                            "predicted", "detail")} for _, row in disagree.iterrows()],
        "files": [str(p) for p in files],
    }
    path = Path(out) / "summary.json"
    write_text_whole(path, json.dumps(summary, indent=1) + "\n")
    return path


def write_index(frames: dict[str, pd.DataFrame], out: Path) -> Path:
    """reports/README.md: every generation side by side (a run of several
    implementations gets one column each)."""
    links = " | ".join(f"[{g}]({g}/summary.md)" for g in frames)
    named = {gen: f.assign(implementation=implementation(f)) for gen, f in frames.items()}
    frames = {(gen if f["implementation"].nunique() == 1 else f"{gen} {name}"): part
              for gen, f in named.items() for name, part in f.groupby("implementation", sort=False)}
    counts = pd.DataFrame({gen: f["verdict"].value_counts() for gen, f in frames.items()})
    counts = counts.reindex([v for v in Verdict if v in counts.index]).fillna(0).astype(int)
    shapes = pd.concat([f.assign(column=name) for name, f in frames.items()])
    shapes = shapes[shapes["probe"] == "roundtrip"]
    side = shapes.pivot_table(index="shape", columns="column", values="verdict",
                              aggfunc="first").reindex(columns=list(frames)).fillna("-")
    everything = pd.concat(list(named.values()))
    disagree = len(disagreements(everything))
    verdict_word = (f"**{disagree} of {len(everything)} cases disagree with their prediction**: each "
                    "generation's summary lists them." if disagree else
                    f"Every one of the {len(everything)} cases earned a verdict its prediction admits.")
    lines = ["# kvprobe reports", "",
             f"{verdict_word} Implementations: {', '.join(sorted(everything['implementation'].unique()))}; "
             f"probes: {everything['probe'].nunique()}; shapes: {everything['shape'].nunique()}. "
             "Each generation links to its summary.", "",
             links, "",
             "## Verdict counts", "",
             "REJECTED is a correct refusal (a layout no manager may move as byte ranges, or bad input), "
             "not a failure; CORRUPT, HANG, CRASH and ERROR are failures where the prediction does not admit "
             "them.", "", _table(counts.reset_index(names="verdict")), "",
             "## Per-block round trip, shape by shape", "",
             "REJECTED: the layout puts blocks inside tiles, so no manager may move them as "
             "byte ranges.", "", _table(side.reset_index()), ""]
    tpu = [name for name, frame in frames.items() if (frame["generation"] != "cpu").all()]
    layouts = shapes.pivot_table(index="shape", columns="column", values="layout",
                                 aggfunc="first").reindex(columns=tpu)
    differing = layouts[layouts.nunique(axis=1) > 1]
    if len(differing):
        lines += ["## Layouts that differ between generations", "",
                  _table(differing.reset_index()), ""]
    path = out / "README.md"
    write_text_whole(path, "\n".join(lines))
    return path


def _counts(frame: pd.DataFrame, by: str) -> str:
    table = pd.crosstab(frame[by], frame["verdict"])
    return _table(table.reindex(columns=[v for v in Verdict if v in table.columns]).reset_index())


def shard_layouts(frame: pd.DataFrame) -> list[str]:
    """Each row's layout, said to be one device's where the cache is sharded
    (its layout is the shard's, beside the cache's global shape)."""
    shardings = frame["sharding"] if "sharding" in frame else [""] * len(frame)
    return [f"one device's shard under {sharding}: {layout}" if isinstance(sharding, str) and sharding.strip()
            else layout for layout, sharding in zip(frame["layout"], shardings)]


def _table(frame: pd.DataFrame) -> str:
    clean = frame.copy()
    for col in clean.columns:
        if clean[col].dtype == object or pd.api.types.is_string_dtype(clean[col]):  # a cell is one line
            clean[col] = clean[col].map(lambda v: " ".join(str(v).split()).replace("|", "/")[:300])
    return clean.to_markdown(index=False)


def side_by_side(frame: pd.DataFrame) -> list[str]:
    """Each case's verdict per implementation, and every case where they differ."""
    table = frame.pivot_table(index="case_id", columns="implementation", values="verdict", aggfunc="first")
    details = frame.pivot_table(index="case_id", columns="implementation", values="detail", aggfunc="first")
    differ = table[table.nunique(axis=1) > 1]
    lines = ["## Side by side", "", _table(table.reset_index()), "",
             "## Where the implementations disagree", ""]
    if differ.empty:
        return lines + ["Nowhere: every case earned the same verdict.", ""]
    for case_id in differ.index:
        lines += [f"### {case_id}", ""]
        for iut in table.columns:
            detail = str(details.at[case_id, iut])
            lines.append(f"- **{iut}**: {table.at[case_id, iut]}: {detail.strip().splitlines()[0][:500]}")
            stack = stacks(detail)
            if stack:
                lines += ["", "  ```", *[f"  {line}" for line in stack.splitlines()], "  ```"]
        lines.append("")
    return lines


STACK_START = re.compile(rf"^(Fatal Python error|{re.escape(WATCHDOG_FIRED)}|Thread 0x|Current thread 0x|Traceback)")
LOG_LINE = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages|InitTransportServer)")


def stacks(detail: str, limit: int = 40) -> str:
    """The Python stacks in a detail (faulthandler's dump or a traceback),
    without the log lines a library writes around them."""
    lines = detail.splitlines()
    start = next((i for i, line in enumerate(lines) if STACK_START.match(line)), None)
    if start is None:
        return ""
    kept = [line for line in lines[start:] if line.strip() and not LOG_LINE.match(line)]
    return "\n".join(kept[:limit])
