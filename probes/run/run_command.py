"""`kvprobe run`, `report` and `qualify`: the commands over probes.run.command's
runs and reports."""

from __future__ import annotations

import argparse
import sys
import time

from probes.run import options
from probes.run.subcommand import Command, stdout_console


def run_arguments(parser: argparse.ArgumentParser) -> None:
    options.add(parser, "generation", "iut", "matrix", "probe", "jobs", "timeout")
    parser.add_argument("--ray", metavar="ADDRESS", default=None,
                        help="run the cases as tasks of a Ray cluster: 'auto' (the cluster this host "
                        "joined), HOST:PORT, or 'local' (a private one-machine cluster, started and "
                        "stopped by the run); needs `pip install 'kvref[ray]'`")
    options.add(parser, "faults", "out")
    parser.add_argument("--case", metavar="CASE_ID", type=options.names, default=[],
                        help="only these cases, comma-separated, by the case_id a run's CSV, summary.json "
                        "and console name (e.g. v5e/plan_binding/plan_binding-bf16_512x8x2048); with "
                        "several IUTs, each one's")


def run(args) -> int:
    from rich.console import Console

    from probes.run import command

    console = Console(stderr=True)
    start = time.monotonic()
    frame = command.run(args.generation, args.iut, args.matrix, args.probe, args.jobs,
                        args.timeout, args.faults, args.out, console, args.ray, args.case)
    stdout_console().print(command.summary_table(frame))
    seconds = frame.attrs.get("seconds", {})
    split = f" (runner {seconds['runner']:.1f} s, reports {seconds['reports']:.1f} s)" if seconds else ""
    print(f"{len(frame)} cases in {time.monotonic() - start:.1f} s{split}; reports: {args.out / 'README.md'}; "
          f"summary: {args.out / 'summary.json'}")
    return verdict_code(frame)


SHOWN = 20  # disagreeing cases named on the console; summary.json has every one


def verdict_code(frame) -> int:
    """1 when any case's verdict is one its prediction does not admit (said on stderr), else 0."""
    from probes.report.results import disagreements

    rows = disagreements(frame)
    if len(rows):
        print(f"kvprobe: {len(rows)} of {len(frame)} cases disagree with their prediction:", file=sys.stderr)
        for _, row in rows.head(SHOWN).iterrows():
            first = str(row["detail"]).strip().splitlines()[0][:160] if str(row["detail"]).strip() else ""
            print(f"  {row['iut']} {row['case_id']} ({row['iut_options']}): {row['verdict']}, predicted "
                  f"{row['predicted']}: {first}", file=sys.stderr)
        if len(rows) > SHOWN:
            print(f"  and {len(rows) - SHOWN} more (summary.json lists them all)", file=sys.stderr)
    return 1 if len(rows) else 0


def report_arguments(parser: argparse.ArgumentParser) -> None:
    options.add(parser, "out")
    parser.add_argument("--update-baseline", action="store_true",
                        help="also write each generation's baseline.csv from its latest run")


def report(args) -> int:
    from probes.run import command

    frames = command.write_reports(args.out)
    print(f"reports for {', '.join(frames)} in {args.out}")
    if args.update_baseline:
        for path in command.update_baselines(args.out, frames):
            print(f"baseline: {path}")
    return 0


def _tpu_type(value: str) -> str:
    (name,) = options.generations(value)
    if name == "cpu":
        raise argparse.ArgumentTypeError("expected a TPU type, not 'cpu'")
    return name


def qualify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("new", type=_tpu_type, metavar="NEW", help="the new TPU type: v2:2x2, v2, local")
    parser.add_argument("--against", type=_tpu_type, required=True, metavar="OLD",
                        help="a TPU type to compare with, e.g. v3")
    options.add(parser, "matrix", "jobs", "timeout", "out")


def qualify(args) -> int:
    from rich.console import Console

    from probes.run import command

    path, frame = command.qualify(args.new, args.against, args.matrix, args.jobs, args.timeout, args.out,
                                  Console(stderr=True))
    print(f"{len(frame)} cases; qualification report: {path}")
    return verdict_code(frame)


RUN = Command("run", "run probe cases in watched workers; write CSVs and reports", run_arguments, run)
REPORT = Command("report", "rewrite reports from each generation's latest run", report_arguments, report)
QUALIFY = Command("qualify", "every default probe on a new TPU type and one already qualified, and a report "
                  "of everything that differs", qualify_arguments, qualify)
