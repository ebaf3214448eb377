"""`kvprobe run` and `kvprobe report`: run cases, write CSVs and reports."""

from __future__ import annotations

import difflib
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

from kvref import GENERATIONS, Faults
from kvref.generations import is_shipped
from kvref.oracle import compiler
from probes.iut import (BuildUnavailable, IUT, device_only_standin, ensure_build, holdable_chips, iut, local_generation,
                        tpu_devices, tpu_visible, usable_iuts)
from probes.report import qualification, results, summary
from probes.report.atomic import write_whole
from probes.report.results import BASELINE, disagreements
from probes.run import netns, options, rows
from probes.run.ray_runner import run_cases_on_ray
from probes.run.runner import Interrupted, run_cases
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.predict import describe
from probes.suite.registry import DEFAULT_PROBES
from probes.suite.verdicts import Verdict


DESCRIBE_JOIN_S = 30.0  # one case's description, on a loaded machine
HEARTBEAT_S = 10.0  # piped output: the longest a run goes without a line


def run(generations, iuts, matrix, probes, jobs, timeout, faults, out: Path, console,
        ray_address: str | None = None, only: list[str] = ()) -> pd.DataFrame:
    """Run the cases here (`only` those of these case ids, where given), `jobs`
    at a time, or as tasks of the Ray cluster at `ray_address`
    (probes.run.ray_runner); write CSVs and reports. The frame's
    attrs["seconds"] has how long the cases and the reports took."""
    cases = chosen(prepare(generations, iuts, matrix, probes, timeout, faults, out, console.print), only)
    run_id = rows.new_run_id()
    done_describing = threading.Event()
    ahead = threading.Thread(target=_describe_ahead, args=(cases, done_describing), daemon=True)
    ahead.start()
    start = time.monotonic()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task(f"probing {', '.join(iuts)}", total=len(cases))
        advance = _Heartbeat(progress, task, len(cases), console, start)
        try:
            found = (run_cases_on_ray(cases, ray_address, advance) if ray_address
                     else run_cases(cases, jobs, progress=advance))
        except Interrupted as stop:  # what had finished, as a run marked partial
            stop.run_id = f"{run_id}-partial"
            results.write_runs(rows.to_frame(stop.finished, stop.run_id), out)
            raise
        finally:
            # Never left running into the interpreter's exit: a thread still in
            # C++ then is killed as it takes the GIL back, and the process aborts.
            done_describing.set()
            ahead.join(DESCRIBE_JOIN_S)
    ran = time.monotonic()
    frame = record(found, run_id, out)
    frame.attrs["seconds"] = {"runner": ran - start, "reports": time.monotonic() - ran}
    return frame


class _Heartbeat:
    """Each finished case advances the bar on a terminal; piped (a CI log,
    where the bar is not drawn) a line says how far the run is, at most
    every HEARTBEAT_S and at its end."""

    def __init__(self, progress, task, total: int, console, start: float):
        self.progress, self.task, self.total, self.console, self.start = progress, task, total, console, start
        self.done, self.said = 0, start

    def __call__(self, result) -> None:
        self.progress.advance(self.task)
        self.done += 1
        now = time.monotonic()
        if not self.console.is_terminal and (now - self.said >= HEARTBEAT_S or self.done == self.total):
            self.said = now
            print(f"kvprobe: {self.done}/{self.total} cases done ({now - self.start:.0f} s)", file=sys.stderr,
                  flush=True)


def chosen(cases: list, only: list[str]) -> list:
    """The cases whose case id is one of `only` (all, where it is empty);
    ValueError naming an id no case of the run has, with the closest."""
    if not only:
        return cases
    ids = {case.case_id for case in cases}
    unknown = [name for name in only if name not in ids]
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(ids), 1)
        raise ValueError(f"--case {unknown[0]!r}: no case of this run has that id"
                         + (f" (did you mean {close[0]!r}?)" if close else "")
                         + "; --generation, --probe and --matrix choose the cases it is picked from")
    return [case for case in cases if case.case_id in only]


def prepare(generations, iuts, matrix, probes, timeout, faults, out: Path | None, say=print) -> list:
    """The cases of a run, after every check that can fail before one runs:
    IUTs, targets, faults, builds, TPU types, the matrix, --out and layouts."""
    faults = Faults.parse(faults, environ={})
    resolved = {name: iut(name) for name in iuts}  # each name resolved once, here; its value passed on
    for declared in resolved.values():  # refuse an unknown IUT, target or fault before starting anything
        for gen in generations:
            declared.check_target(gen)
        declared.check_faults(faults)
    for name, declared in resolved.items():  # a build other than the pinned one: installed now, or its cases SKIP
        if declared.build:
            try:
                ensure_build(declared.library.distribution, declared.build)
            except BuildUnavailable as e:
                say(f"[yellow]{name}: {e}; its cases SKIP[/yellow]")
    namespaced = [name for name, declared in resolved.items() if declared.loopback_only]
    if namespaced and (reason := netns.unavailable()):  # said once here, not only in each case's SKIP
        say(f"[yellow]{', '.join(namespaced)}: {reason}; its cases SKIP[/yellow]")
    for gen in generations:
        if gen != "cpu" and not is_shipped(gen):
            reason = compiler.accepts(gen)
            if reason:
                raise ValueError(f"TPU type {gen!r}{options.meant(gen)}: {reason}")
            if options.meant(gen):  # a TPU type libtpu takes, but a shipped one was likely meant
                say(f"[yellow]note: {gen!r} is not a shipped TPU type; its layouts are compiled live"
                    f"{options.meant(gen)}[/yellow]")
    matrix_rows = load_matrix(matrix)
    if out is not None:
        check_out(out)
    check_layouts(matrix, matrix_rows, generations, iuts)
    cases = [c for name, declared in resolved.items()
             for c in build_cases(generations, matrix_rows, probes or DEFAULT_PROBES, name, faults, timeout,
                                  devices_of(declared), chips_of(declared))]
    if not cases:
        raise ValueError("no cases: the matrix and --probe select nothing")
    for case in cases:  # a new TPU type's layouts: compiled once here, cached for the workers
        if not is_shipped(case.generation) and case.generation != "cpu":
            describe(case)
    return cases


def _describe_ahead(cases, stop: threading.Event) -> None:
    """Each case's layout facts and prediction depend on the case alone: found
    while the workers run (the parent is idle then), what is slow in them
    (probes.suite.ownership) is cached for the rows written after the last one.
    Ends at the next case once `stop` is set."""
    for case in cases:
        if stop.is_set():
            return
        try:
            describe(case)
        except Exception:  # noqa: BLE001  writing the case's row meets it again, and says what it was
            pass


def devices_of(declared: IUT) -> int | None:
    """How many devices an IUT's cases may split a cache over: this machine's
    TPU devices for an IUT that owns one (the parent does not open the TPU:
    it counts chips on the PCI bus); unbounded for the others, which make
    their own (a mesh of simulated chips, JAX CPU devices)."""
    if not declared.owns_device or device_only_standin():
        return None
    return tpu_devices()


def chips_of(declared: IUT) -> int | None:
    """How many chips an IUT's worker processes may hold one each: this
    machine's TPU chips (counted on the PCI bus, or those the user made
    visible) for an IUT that owns one; None for the others, which make
    their own devices."""
    if not declared.owns_device or device_only_standin():
        return None
    return len(holdable_chips())


def record(found, run_id: str, out: Path) -> pd.DataFrame:
    """The results of a run as CSVs, each generation's report and the index."""
    return record_frame(rows.to_frame(found, run_id), out)


def record_frame(frame: pd.DataFrame, out: Path) -> pd.DataFrame:
    """A run's rows (every part of it, where several processes ran it) as
    CSVs, each generation's report and the index."""
    files = results.write_runs(frame, out)
    for gen, part in frame.groupby("generation", sort=False):
        files.append(summary.write_generation_report(part, Path(out) / results.generation_dir(gen)))
    files.append(summary.write_index(latest_frames(out, committed=True), Path(out)))
    summary.write_run_json(frame, files, out)
    return frame


def check_layouts(matrix: str, matrix_rows, generations, iuts) -> None:
    """Every row's layout on every generation, looked up (or compiled, and
    cached for the workers) before any case runs, so a shape the compiler
    refuses names its matrix and row."""
    for name in iuts:
        for gen in generations:
            declared = iut(name)
            for row in matrix_rows:
                try:
                    declared.layout_of(gen, row.shape)
                    if row.sharding and declared.shards:  # (rows the arrays cannot split are not made)
                        declared.layout_of(gen, row.shape, row.sharding)
                except Exception as e:  # the compiler's refusal, named
                    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    raise ValueError(f"matrix {matrix}, row {row.name!r} ({row.shape}) on {gen}: {first}") from None


def check_out(out: Path) -> None:
    """The report directory can be written, found before the first case runs
    rather than after the last."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; expected a directory for the reports")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise ValueError(f"--out {out} cannot be written ({e.strerror or e}); expected a writable "
                         "directory for the reports") from None


def latest_frames(out: Path, committed: bool = False) -> dict[str, pd.DataFrame]:
    """Each generation's latest run under `out`, in generation order. With
    `committed`, a generation that has no run here is read from its baseline
    (a clone has the committed reports but none of their runs)."""
    out, frames = Path(out), {}
    order = {g: i for i, g in enumerate(GENERATIONS)}
    for gen_dir in sorted((p for p in out.iterdir() if p.is_dir()),
                          key=lambda p: (order.get(p.name, len(order)), p.name)):
        latest = results.latest_run(gen_dir)
        if latest:
            frames[gen_dir.name] = results.read_run(latest)
            if frames[gen_dir.name].empty:
                raise ValueError(f"{latest} holds no cases (a header alone): no report can be drawn from it")
        elif committed and (gen_dir / BASELINE).exists():
            frames[gen_dir.name] = results.read_run(gen_dir / BASELINE)
    return frames


def write_reports(out: Path) -> dict[str, pd.DataFrame]:
    """Reports from each generation's latest run, and the index (with the
    generations that only have a baseline); returns the runs' frames."""
    if not Path(out).is_dir():
        raise ValueError(f"no reports folder {out}; run `kvprobe run --out {out}` first")
    frames = latest_frames(out, committed=True)
    ran = {gen: frame for gen, frame in frames.items() if results.latest_run(Path(out) / gen)}
    if not ran:
        raise ValueError(f"no runs under {out}; run `kvprobe run` first")
    for gen, frame in ran.items():
        summary.write_generation_report(frame, Path(out) / gen)
    summary.write_index(frames, Path(out))
    return ran


def update_baselines(out: Path, frames: dict[str, pd.DataFrame]) -> list[Path]:
    paths = []
    for gen, frame in frames.items():
        path = Path(out) / gen / BASELINE
        # In the run's order, so an index drawn from it (latest_frames) is the run's own.
        write_whole(path, lambda f, frame=frame: frame[results.DETERMINISTIC].to_csv(f, index=False))
        paths.append(path)
    return paths


def summary_table(frame: pd.DataFrame):
    from rich.table import Table

    table = Table(title=f"kvprobe run {frame['run_id'].iloc[0]}")
    verdicts = [v for v in Verdict if v in set(frame["verdict"])]
    for col in ["generation", *verdicts, "disagreements"]:
        table.add_column(col, justify="right")
    for gen, part in frame.groupby("generation", sort=False):
        counts = part["verdict"].value_counts()
        table.add_row(gen, *[str(counts.get(v, 0)) for v in verdicts],
                      str(len(disagreements(part))))
    return table


def qualify(new: str, old: str, matrix: str, jobs, timeout, out: Path, console) -> tuple[Path, pd.DataFrame]:
    """The default probes over `matrix` on both TPU types in one run (on a
    TPU VM of the new type, the production libraries on its hardware too),
    then reports/<new>/qualification-vs-<old>.md."""
    if new == old:
        raise ValueError(f"qualify {new} against another TPU type, not itself")
    frame = run([new, old], ["kvref-sim"], matrix, None, jobs, timeout, [], out, console)
    hardware = hardware_iuts(new)
    if hardware:
        frame = pd.concat([frame, run([new], hardware, matrix, None, jobs, timeout, [], out, console)])
    new_frame, old_frame = (frame[frame["generation"] == g] for g in (new, old))
    path = Path(out) / results.generation_dir(new) / f"qualification-vs-{results.generation_dir(old)}.md"
    return qualification.write(new_frame, old_frame, new, old, path), frame


def hardware_iuts(generation: str) -> list[str]:
    """The hardware IUTs that run on this machine's TPU, when it is `generation`."""

    if not tpu_visible() or local_generation() != generation:
        return []
    return [name for name, declared in usable_iuts().items() if declared.owns_device
            and declared.runs_on(generation)]
