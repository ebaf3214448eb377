"""kvprobe run/report/diff end to end, and the committed baselines."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

import kvref
from probes.report import results
from probes.run import cli, rows
from probes.run.runner import run_cases
from probes.suite.matrix import DEFAULT_MATRIX, build_cases, load_matrix

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def fresh_run(generations) -> pd.DataFrame:
    cases = build_cases(generations, load_matrix(DEFAULT_MATRIX))
    return rows.to_frame(run_cases(cases), "test")


def _read_baseline(gen):
    return results.deterministic(results.read_run(REPORTS / gen / results.BASELINE))


def assert_reproduces_baseline(gen):
    fresh = results.deterministic(fresh_run([gen]))
    pd.testing.assert_frame_equal(fresh, _read_baseline(gen).astype(fresh.dtypes.to_dict()))


def test_fresh_run_reproduces_the_tpu7x_baseline():
    assert_reproduces_baseline("tpu7x")


def test_the_main_job_finds_every_layout_in_the_shipped_table(monkeypatch, tmp_path):
    """On a machine whose layout cache is empty, one generation's default
    run compiles nothing: a first run after install costs what a warm one does."""
    monkeypatch.setenv("KVREF_CACHE_DIR", str(tmp_path))
    frame = fresh_run(["v5e"])
    sources = frame["layout_source"].fillna("")
    assert sources.str.startswith("table").all(), sources.value_counts()
    assert not list(tmp_path.iterdir()), f"the run compiled layouts: {sorted(p.name for p in tmp_path.iterdir())}"


@pytest.mark.slow
@pytest.mark.parametrize("gen", [g for g in kvref.GENERATIONS if g != "tpu7x"])
def test_fresh_run_reproduces_every_baseline(gen):
    assert_reproduces_baseline(gen)


@pytest.mark.parametrize("gen", ["tpu7x", "v5e"])
def test_each_baseline_roundtrip_agrees_with_an_independent_packing_of_its_layout(gen):
    """Not a snapshot: each committed roundtrip row derived again without the
    code that ran it, its layout from the shipped table and its verdict and
    slice size from packing row numbers through the layout
    (probes.suite.ownership), not from kvref.major_slice or a manager."""
    from kvref.oracle import table
    from probes.suite.ownership import row_byte_ranges

    baseline = _read_baseline(gen)
    roundtrips = baseline[(baseline.probe == "roundtrip") & (baseline.sharding == "")]
    checked = 0
    for row in roundtrips.itertuples():
        key = kvref.ShapeKey.parse(row.shape)
        if table.lookup(gen, str(key)) is None:  # a shape the table does not hold (a row of another matrix)
            continue
        checked += 1
        layout_text, compiler_bytes = table.lookup(gen, str(key))
        assert (row.layout, row.physical_bytes) == (str(kvref.Shape.parse(layout_text)), compiler_bytes), row.case_id
        ranges = row_byte_ranges(row.layout)
        assert row.verdict == ("PASS" if ranges.contiguous else "REJECTED"), row.case_id
        if ranges.contiguous:
            assert row.slice_bytes == ranges.slice_bytes == row.physical_bytes // key.dims[0], row.case_id
    assert checked > 20


def test_seed_refusals_in_the_committed_reports():
    """The seed's three shapes and the MLA cache are refused on tpu7x."""
    baseline = _read_baseline("tpu7x")
    refused = set(baseline[(baseline.probe == "roundtrip") & (baseline.verdict == "REJECTED")].layout)
    for layout in ("bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}", "bf16[512,6144]{1,0:T(8,128)(2,1)}",
                   "s8[512,12288]{1,0:T(32,128)(4,1)}", "bf16[1024,32,576]{0,2,1:T(8,128)(2,1)}"):
        assert layout in refused
    assert (REPORTS / "README.md").exists()
    for gen in kvref.GENERATIONS:
        assert (REPORTS / gen / "summary.md").exists() and (REPORTS / gen / "verdicts.png").exists()


def test_run_report_and_diff(tmp_path, capsys):
    out = tmp_path / "reports"
    code = cli.main(["run", "-g", "v3,v4", "--matrix", "seed", "--probe", "roundtrip,plan_binding",
                     "--out", str(out), "-j", "2"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "v3" in printed and "v4" in printed and "disagreements" in printed
    v3_csv, v4_csv = (next((out / g / "runs").glob("*.csv")) for g in ("v3", "v4"))
    frame = results.read_run(v3_csv)
    assert list(frame.columns) == results.COLUMNS and len(frame) == 9
    assert set(frame.verdict) <= {"PASS", "REJECTED"} and (frame.verdict == frame.predicted).all()
    summary = (out / "v3" / "summary.md").read_text()
    assert "## Refused shapes" in summary and "s8[512,12288]{1,0:T(8,128)(4,1)}" in summary
    assert "[v3](v3/summary.md)" in (out / "README.md").read_text()
    assert list((out / "v3").glob("memory-map-*.png"))

    assert cli.main(["diff", str(v3_csv), str(v4_csv)]) == 1
    diff = capsys.readouterr().out
    assert "s8[512,12288]{1,0:T(8,128)(4,1)}" in diff and "s8[512,12288]{1,0:T(32,128)(4,1)}" in diff
    assert cli.main(["diff", str(v3_csv), str(v3_csv)]) == 0
    assert "no differences" in capsys.readouterr().out
    two_iuts = tmp_path / "two-iuts.csv"  # a case on several IUTs is a row for each, compared with its own
    pd.concat([frame, frame.assign(iut="other-iut", verdict="ERROR")]).to_csv(two_iuts, index=False)
    assert cli.main(["diff", str(v3_csv), str(two_iuts)]) == 1
    changes = capsys.readouterr().out
    assert "only in B" in changes and "on other-iut" in changes and "on kvref-sim |" not in changes

    (out / "v3" / "summary.md").unlink()
    assert cli.main(["report", "--out", str(out)]) == 0
    assert (out / "v3" / "summary.md").exists()


def test_faulty_run_reports_disagreements(tmp_path, capsys):
    out = tmp_path / "reports"
    assert cli.main(["run", "-g", "tpu7x", "--matrix", "seed", "--probe", "roundtrip",
                     "--faults", "legacy_slice_formula", "--out", str(out)]) == 1  # cases that disagree
    summary = (out / "tpu7x" / "summary.md").read_text()
    assert "CORRUPT" in summary and "legacy_slice_formula" in summary


def test_skipped_cases_are_listed_apart_not_as_disagreements(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVPROBE_PEER_TORCH_PYTHON", "/nonexistent/python")
    out = tmp_path / "reports"
    assert cli.main(["run", "-g", "tpu7x", "--iut", "tpu-sync-torch-tpu", "--matrix", "seed",
                     "--probe", "roundtrip", "--out", str(out)]) == 0
    frame = results.read_run(next((out / "tpu7x" / "runs").glob("*.csv")))
    assert (frame.verdict == "SKIP").all() and (frame.predicted != "SKIP").all()
    summary = (out / "tpu7x" / "summary.md").read_text()
    assert "None ran: every case was skipped." in summary
    skipped = summary.split("## Skipped")[1].split("##")[0]
    row = next(line for line in skipped.splitlines() if "kvprobe peer-env --lib torch" in line)
    assert row.split("|")[-2].strip() == str(len(frame))  # one reason, counted over every case


@pytest.mark.parametrize("argv, needle", [
    (["run", "--probe", "nope"], "unknown probe(s) ['nope']"),
    (["run", "--timeout", "0"], "expected a positive number"),
    (["run", "-g", "V9"], "unknown TPU generation 'V9'"),
    (["run", "--faults", "bogus"], "argument --faults: unknown fault model(s) ['bogus']"),
    (["fuzz", "--faults", "bogus"], "argument --faults: unknown fault model(s) ['bogus']"),
])
def test_bad_run_arguments(capsys, argv, needle):
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["run", "--matrix", "nope"], "no shape matrix 'nope'"),
    (["run", "--iut", "nope", "--matrix", "seed", "-g", "v3", "--probe", "plan_binding"],
     "unknown implementation under test 'nope'"),
    (["diff", "/nonexistent/a.csv", "/nonexistent/b.csv"], "no such run file"),
])
def test_bad_run_inputs_exit_2(capsys, tmp_path, argv, needle):
    assert cli.main(argv + ["--out", str(tmp_path)] if argv[0] == "run" else argv) == 2
    assert needle in capsys.readouterr().err


def test_user_matrix_errors(tmp_path):
    bad = tmp_path / "m.csv"
    bad.write_text('name,shape\nx,"bf16[512by3]"\n')
    with pytest.raises(ValueError, match=r"m.csv:2: malformed dims '512by3' in 'bf16\[512by3\]'; expected "
                       r"comma-separated integers"):
        load_matrix(str(bad))
    bad.write_text("name,dtype,dims\nx,bf16,512x3\n")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['shape'\]; expected name,shape"):
        load_matrix(str(bad))
    bad.write_text('name,shape,probes\nx,"bf16[512,8]",roundtrip teleport\n')
    with pytest.raises(ValueError, match=r"unknown probe\(s\) \['teleport'\]"):
        load_matrix(str(bad))


def test_the_index_keeps_the_generations_that_ran_elsewhere(tmp_path):
    """A clone has the committed reports but none of their runs: the index a
    run there writes still has every generation with a committed baseline
    (the CPU peers' run among them), the ones that ran here from their runs."""
    from probes.run.command import latest_frames
    from probes.report import summary

    out = tmp_path / "reports"
    shutil.copytree(REPORTS, out, ignore=shutil.ignore_patterns("runs"))
    committed = sorted(p.parent.name for p in out.glob(f"*/{results.BASELINE}"))
    assert "cpu" in committed
    assert not latest_frames(out)
    frames = latest_frames(out, committed=True)
    assert sorted(frames) == committed
    index = summary.write_index(frames, out).read_text()
    for gen in committed:
        assert f"[{gen}]({gen}/summary.md)" in index
    assert "cpu tpu-sync-jax" in index  # one column per implementation of the CPU peers' run


def test_a_memory_map_an_earlier_run_left_is_removed_with_its_link(tmp_path, capsys):
    out = tmp_path / "reports"
    assert cli.main(["run", "-g", "v5e", "--matrix", "seed", "--probe", "roundtrip", "--out", str(out)]) == 0
    stray = out / "v5e" / "memory-map-of-an-earlier-run.png"
    stray.write_bytes(b"")
    assert cli.main(["report", "--out", str(out)]) == 0
    summary = (out / "v5e" / "summary.md").read_text()
    maps = sorted(p.name for p in (out / "v5e").glob("memory-map-*.png"))
    assert maps and not stray.exists() and all(name in summary for name in maps)


def test_a_table_cell_with_a_traceback_stays_one_row():
    from probes.report.summary import _table

    frame = pd.DataFrame({"detail": pd.Series(["ERROR\nTraceback (most recent call last):\n  File 'x' | y"],
                                              dtype="string"), "cases": [1]})
    lines = _table(frame).splitlines()
    assert len(lines) == 3 and "Traceback (most recent call last): File 'x' / y" in lines[2], lines


def test_a_sharded_cases_layout_is_said_to_be_one_devices_shard():
    from probes.report.summary import shard_layouts

    frame = pd.DataFrame({"shape": ["bf16[512,8,128]", "bf16[512,8,128]"], "sharding": ["", "mesh(model=4) "
                                                                                         "spec(None,model)"],
                          "layout": ["bf16[512,8,128]{2,1,0}", "bf16[512,2,128]{2,1,0}"]})
    assert shard_layouts(frame) == ["bf16[512,8,128]{2,1,0}", "one device's shard under mesh(model=4) "
                                    "spec(None,model): bf16[512,2,128]{2,1,0}"]
    assert shard_layouts(frame.drop(columns="sharding")) == list(frame["layout"])
