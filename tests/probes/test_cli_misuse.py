"""kvprobe under misuse: every argument error is one line naming the
argument or file and what was expected, exit 2, found before any case runs."""

import os
import signal

import pandas as pd
import pytest

from kvref.polling import wait_for
from probes.run import cli
from probes.suite.matrix import DEFAULT_MATRIX, build_cases, load_matrix
from probes.suite.registry import PROBES
from tests.processes import cmdline, descendants
from tests.terminal_signals import terminal_signals


def refused(capsys, *argv) -> str:
    try:
        code = cli.main(["run", "-g", "tpu7x", *argv])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]  # argparse prints its usage lines before the error
    assert last.startswith(("kvprobe: error: ", "kvprobe run: error: ")), err
    return last


@pytest.mark.parametrize("value", ["2200000", "1e8", "1e10", "1" + "0" * 400])
def test_a_timeout_past_a_week_is_one_line_naming_the_bound(capsys, value):
    """An OverflowError traceback, before: every wait's clock would overflow."""
    line = refused(capsys, "--timeout", value)
    assert "argument --timeout: expected a positive number" in line and len(line) < 200, line
    assert "of at most 604800" in line or "not infinite" in line  # 401 digits are an infinite float


def test_a_count_of_any_length_is_one_line_naming_the_bound(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["explain", "bf16[64,8,128]", "--layers", "1" + "0" * 400])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "at most 2,147,483,648" in err[0], err


@pytest.mark.parametrize("option", ["iut", "probe", "generation", "faults"])
def test_an_option_given_no_value_is_one_line_naming_it(capsys, option):
    """argparse hands `--NAME=--` to the command as an empty list, never asking the option's parser."""
    line = refused(capsys, f"--{option}=--")
    assert line.startswith(f"kvprobe: error: --{option}: no value"), line


@pytest.mark.parametrize("argv, hint", [(("--matrix", "defualt"), "did you mean 'default'?"),
                                        (("--faults", "legacy_slice_formla"), "did you mean 'legacy_slice_formula'?")])
def test_a_misspelled_matrix_or_fault_gets_a_suggestion(capsys, argv, hint):
    assert hint in refused(capsys, *argv)


def test_a_timeout_that_is_not_finite(capsys):
    assert "argument --timeout: expected a positive number, not infinite or NaN, got 'inf'" in \
        refused(capsys, "--timeout", "inf")


def test_an_out_that_is_a_file_is_found_before_any_case(capsys, tmp_path):
    file = tmp_path / "reports"
    file.write_text("")
    assert f"--out {file} is a file; expected a directory" in refused(capsys, "--matrix", "seed", "--out", str(file))
    assert not any(tmp_path.glob("*/runs"))


def test_an_out_that_cannot_be_made(capsys, tmp_path):
    (tmp_path / "plain").write_text("")
    out = tmp_path / "plain" / "reports"
    assert f"--out {out} cannot be written" in refused(capsys, "--matrix", "seed", "--out", str(out))


@pytest.mark.parametrize("content, message", [
    (b'name,shape\na,"bf16[64,8,128]"\na,"f32[64,8,128]"\n',
     "m.csv:3: row name 'a' is also the name of line 2; each row needs its own name"),
    (bytes(range(128, 256)) * 3, "m.csv: not a text CSV file"),
    (b'name,shape,probe\na,"bf16[64,8,128]",roundtrip\n', "m.csv: unknown column 'probe' (did you mean 'probes'?)"),
    (b'name,shape,owner\na,"bf16[64,8,128]",me\n', "m.csv: unknown column 'owner'; expected name,shape"),
    (b"name,shape\nx," + b"y" * 200_000 + b"\n", "m.csv: field larger than field limit"),
])
def test_a_matrix_that_is_not_one_names_the_file(capsys, tmp_path, content, message):
    matrix = tmp_path / "m.csv"
    matrix.write_bytes(content)
    assert message in refused(capsys, "--matrix", str(matrix), "--out", str(tmp_path / "out"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_stops_the_run_at_once_and_keeps_what_finished(tmp_path, signum):
    """SIGINT (Ctrl-C) during a run, or SIGTERM (a CI cancel, `timeout`), or
    SIGHUP (a closed terminal): no queued case starts, running workers end,
    one line is printed, exit 128 + the signal, and finished cases are
    written as a run marked partial. (A shell's background job ignores
    SIGINT, so the run is started here directly.)"""
    import subprocess
    import sys

    # Every probe: cases that wait out timeouts of their own, so the run is
    # still going when the signal comes, however fast the machine.
    command = [sys.executable, "-m", "probes.run.cli", "run", "-g", "v5e", "--probe", "all", "--out", str(tmp_path)]
    scratch = tmp_path / "tmp"  # where the run makes its temporary folders (two-process rendezvous, zygotes)
    scratch.mkdir()
    with terminal_signals():
        run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TMPDIR": str(scratch)})
    # Past start-up, however loaded the machine: a case's worker runs.
    wait_for(lambda: any("probes.run" in cmdline(p) for p in descendants(run.pid)), 120, 0.2)
    run.send_signal(signum)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signum, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip() and " cases done (" not in line]  # but heartbeats
    assert len(lines) == 1 and lines[0].startswith(f"kvprobe: interrupted ({signum.name})"), err[-2000:]
    runs = list(tmp_path.glob("*/runs/*.csv"))
    assert all(p.stem.endswith("-partial") for p in runs), runs
    if "finished cases kept" in lines[0]:
        assert runs
    everything = len(build_cases(["v5e"], load_matrix(DEFAULT_MATRIX), tuple(PROBES)))
    assert sum(len(pd.read_csv(p)) for p in runs) < everything  # the queued cases never started
    assert not list(scratch.glob("kvprobe-*")), list(scratch.iterdir())  # what the run made, it removed


@pytest.mark.oracle
def test_a_shape_the_compiler_refuses_names_the_matrix_and_row(capsys, tmp_path):
    matrix = tmp_path / "m.csv"
    matrix.write_text('name,shape\nfits,"bf16[64,8,128]"\nhuge,"bf16[1099511627776,8]"\n')
    line = refused(capsys, "--matrix", str(matrix), "--out", str(tmp_path / "out"))
    assert f"matrix {matrix}, row 'huge' (bf16[1099511627776,8]) on tpu7x: " in line


INTERRUPTED_WHILE_IMPORTING = """
import importlib.abc, os, signal, sys

class Interrupting(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "probes.run.cli":  # Ctrl-C in the middle of the commands' imports
            os.kill(os.getpid(), signal.SIG%s)
        return None

sys.meta_path.insert(0, Interrupting())
from probes.run import entry
sys.argv = ["kvprobe", "explain", "bf16[64,8,128]"]
sys.exit(entry.main())
"""


@pytest.mark.parametrize("signame", ["INT", "TERM"])
def test_a_signal_while_the_command_is_still_importing_ends_it_in_one_line(signame):
    import subprocess
    import sys

    with terminal_signals():
        done = subprocess.run([sys.executable, "-c", INTERRUPTED_WHILE_IMPORTING % signame], capture_output=True,
                              text=True, timeout=120)
    signum = getattr(signal, f"SIG{signame}")
    assert done.returncode == 128 + signum, done.stderr[-2000:]
    assert done.stderr.strip() == f"kvprobe: interrupted (SIG{signame}) while starting" and not done.stdout
