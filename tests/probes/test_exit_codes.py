"""kvprobe's exit codes, as a CI job reads them (`kvprobe --help` states
them): 0 all agree, 1 a disagreement or a finding, 2 a usage error or bad
input, 3 kvprobe's own failure, 128+N a signal."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from probes.run import cli
from probes.run.subcommand import Command

KVPROBE = [sys.executable, "-m", "probes.run.cli"]


def kvprobe(*argv, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([*KVPROBE, *argv], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("faults, code", [((), 0), (("--faults", "str_only_plan_binding"), 1)])
def test_a_run_exits_1_when_a_case_disagrees_with_its_prediction(tmp_path, faults, code):
    done = kvprobe("run", "-g", "v5e", "--iut", "kvref-sim", "--probe", "plan_binding", *faults,
                   "--out", str(tmp_path))
    assert done.returncode == code, done.stderr[-2000:]
    assert "kvprobe: 1/1 cases done (" in done.stderr  # piped: a line says how far the run is, and its end
    said = "1 of 1 cases disagree with their prediction"
    assert (said in done.stderr) == bool(code), done.stderr[-2000:]
    named = "  kvref-sim v5e/plan_binding/"  # the case that disagrees, on the console, with its verdict
    assert (named in done.stderr and ": ERROR, predicted PASS: " in done.stderr) == bool(code), done.stderr[-2000:]
    # The same, for a dashboard: summary.json beside the reports, naming the run's files.
    summary = json.loads((tmp_path / "summary.json").read_text())
    (csv,) = [f for f in summary["files"] if f.endswith(".csv")]
    frame = pd.read_csv(csv, keep_default_na=False)
    assert summary["cases"] == len(frame) == 1 and summary["verdicts"] == frame["verdict"].value_counts().to_dict()
    assert [d["case_id"] for d in summary["disagreements"]] == (list(frame["case_id"]) if code else [])
    assert all(d["detail"] == frame["detail"].iloc[0] for d in summary["disagreements"])  # why, for a CI job


def test_a_diff_of_a_file_that_is_not_a_run_is_one_line_and_exit_2(tmp_path):
    bad, empty, header = tmp_path / "bad.csv", tmp_path / "empty.csv", tmp_path / "header.csv"
    bad.write_text("case_id\nx\n")
    empty.write_text("")
    from probes.report.results import COLUMNS

    header.write_text(",".join(COLUMNS) + "\n")
    for a, b in ((bad, bad), (empty, bad), (header, header)):
        done = kvprobe("diff", str(a), str(b))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith(f"kvprobe: error: {a} ") and ("run CSV" in lines[0] or "no cases" in lines[0]), lines


def test_report_and_diff_of_a_malformed_run_are_one_line_naming_the_file_and_exit_2(tmp_path):
    # What a user holds after a hand edit, a torn copy or a spreadsheet's save: each is refused
    # by name, by both commands that read runs (report ended in a traceback on some).
    from probes.report.results import COLUMNS

    good = tmp_path / "good.csv"
    row = {c: "" for c in COLUMNS} | {"generation": "v5e", "verdict": "PASS", "seconds": "1.0",
                                   "case_id": "v5e/roundtrip/x"}
    pd.DataFrame([row]).to_csv(good, index=False)
    malformed = {"header_only": ",".join(COLUMNS) + "\n", "torn_quote": '\xff\x00garbage,"unterminated\n',
                 "wrong_type": good.read_text().replace(",1.0,", ",abc,"), "bare_id": "v5e/roundtrip/x\n",
                 "bare_case_name": good.read_text().replace("v5e/roundtrip/x", "x"),
                 "empty": ""}
    for name, text in malformed.items():
        runs = tmp_path / name / "v5e" / "runs"
        runs.mkdir(parents=True)
        (runs / "r.csv").write_text(text)
        for argv, path in ((("report", "--out", str(tmp_path / name)), runs / "r.csv"),
                           (("diff", str(good), str(runs / "r.csv")), runs / "r.csv")):
            done = kvprobe(*argv)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1, (name, argv[0], done.stderr[-2000:])
            assert lines[0].startswith(f"kvprobe: error: {path} "), (name, lines)


def test_a_mistyped_command_is_one_line_with_what_was_meant():
    done = kvprobe("runn")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "invalid choice: 'runn'" in lines[0] and "did you mean 'run'?" in lines[0], lines


def test_a_mistyped_iut_or_probe_says_what_was_meant(capsys):
    assert cli.main(["run", "--iut", "kvref-sym"]) == 2
    assert "(did you mean 'kvref-sim'?)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", "--probe", "roundtrp"])
    assert stop.value.code == 2 and "(did you mean 'roundtrip'?)" in capsys.readouterr().err


def test_version():
    from importlib.metadata import version

    done = kvprobe("--version")
    said = done.stdout.strip()
    assert done.returncode == 0 and said.startswith(f"kvprobe {version('kvref')}, "), done
    # which code that is: this checkout (a source tree, its commit), and the Python that runs it
    assert f"the source tree {Path(__file__).resolve().parents[2]} at " in said and sys.executable in said, said


def test_the_help_states_the_exit_codes():
    done = kvprobe("--help")
    assert done.returncode == 0 and "exit codes" in done.stdout
    for code in ("0 ", "1 ", "2 ", "3 ", "128+N"):
        assert f"\n  {code}" in done.stdout, done.stdout


def test_kvprobes_own_failure_is_exit_3_with_its_traceback(monkeypatch, capsys):
    def broken(args):
        raise TypeError("a bug in kvprobe")

    def build():
        parser = cli.Parser(prog="kvprobe")
        Command("broken", "always fails", lambda p: None, broken).add_to(parser.add_subparsers(dest="command"))
        return parser

    monkeypatch.setattr(cli, "build_parser", build)
    assert cli.main(["broken"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("kvprobe: internal error (exit 3)") and "TypeError: a bug in kvprobe" in err, err


def test_a_parser_error_exits_2_in_one_line(capsys):
    parser = cli.Parser(prog="kvprobe x")
    parser.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--n", "many"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("kvprobe x: error: argument --n"), err


@pytest.mark.parametrize("argv, said", [
    (["report", "--out", "{tmp}/never"], "no reports folder {tmp}/never; run `kvprobe run --out {tmp}/never` first"),
    (["explain", "bf16[64,8,128]", "-g", "v5e", "--png", "{tmp}/nodir/x.png"], "no folder '{tmp}/nodir'"),
    (["explain", "bf16[64,8,128]", "-g", "v5e", "--png", "{tmp}/x.jpg"], "expected a file name ending in .png"),
])
def test_a_mistake_is_one_line_before_anything_is_done(tmp_path, argv, said):
    done = kvprobe(*[a.format(tmp=tmp_path) for a in argv])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and said.format(tmp=tmp_path) in lines[0], done.stderr
    assert done.stdout == "" and not list(tmp_path.iterdir())  # nothing explained, nothing written


@pytest.mark.oracle  # 'v5' is described by the installed libtpu
def test_a_tpu_type_that_is_a_prefix_of_shipped_ones_says_which_were_likely_meant():
    from probes.run import command, options

    assert options.generations("v5") == ["v5"]
    said = []
    command.prepare(["v5"], ["kvref-sim"], "default", ["bad_input"], 30.0, (), None, say=said.append)
    assert any("'v5' is not a shipped TPU type; its layouts are compiled live (did you mean 'v5e' or 'v5p'?)"
               in line for line in said), said


@pytest.mark.oracle  # libtpu is asked whether it compiles for 'tpu7'
def test_a_tpu_type_libtpu_refuses_is_one_line_with_the_shipped_one_meant():
    done = kvprobe("run", "-g", "tpu7", "--probe", "roundtrip")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("kvprobe: error: TPU type 'tpu7' (did you mean 'tpu7x'?): the installed libtpu"), lines


def test_one_case_of_a_run_is_rerun_by_its_id(tmp_path):
    """The id a run names a disagreeing case by selects that case alone; an id no case has is one line."""
    from probes.run import command

    ids = [c.case_id for c in command.prepare(["v5e"], ["kvref-sim"], "default", ["bad_input"], 30.0, (), None)]
    assert len(ids) > 2
    done = kvprobe("run", "-g", "v5e", "--probe", "bad_input", "--case", ids[1], "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    (csv,) = [f for f in summary["files"] if f.endswith(".csv")]
    assert list(pd.read_csv(csv)["case_id"]) == [ids[1]]
    wrong = kvprobe("run", "-g", "v5e", "--probe", "bad_input", "--case", ids[1] + "x", "--out", str(tmp_path))
    assert wrong.returncode == 2 and f"did you mean {ids[1]!r}" in wrong.stderr, wrong.stderr[-2000:]


def test_a_misspelled_column_of_a_run_is_named_as_what_it_likely_meant(tmp_path):
    from probes.report.results import COLUMNS

    row = {c: "" for c in COLUMNS} | {"generation": "v5e", "verdict": "PASS", "case_id": "v5e/roundtrip/x"}
    path = tmp_path / "r.csv"
    pd.DataFrame([row]).rename(columns={"verdict": "verdcit"}).to_csv(path, index=False)
    done = kvprobe("diff", str(path), str(path))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "has no column verdict (misspelled? it has 'verdcit' for verdict)" in lines[0], lines
