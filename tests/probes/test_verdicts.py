"""Verdicts and predictions: one value each, one text form each. The text is
what results tables, reports and messages hold, and reads back as the value."""

import csv
import json

import pandas as pd
import pytest

from probes.report import results
from probes.run import rows
from probes.run.runner import CaseResult
from probes.suite.matrix import build_cases
from probes.suite.predict import describe, prediction
from probes.suite.verdicts import Outcome, Prediction, Verdict, both_sides


def test_a_verdict_is_written_as_its_name_everywhere():
    v = Verdict.REJECTED
    assert (str(v), f"{v}", f"{v:>9}", "%s" % v, json.dumps(v)) == \
        ("REJECTED", "REJECTED", " REJECTED", "REJECTED", '"REJECTED"')
    assert Outcome(**json.loads(json.dumps(Outcome(v, "refused").to_dict()))) == Outcome(v, "refused")


def test_a_prediction_has_one_text_form_and_reads_back():
    either = Prediction((Verdict.PASS, Verdict.REJECTED))
    assert str(either) == f"{either}" == "PASS|REJECTED"  # the reference's first
    assert Prediction.parse("PASS|REJECTED") == either and Prediction.parse(str(either)) == either
    assert Prediction.parse("REJECTED|PASS") != either  # the order says which the reference earns
    assert either.admits("PASS") and either.admits(Verdict.REJECTED) and not either.admits(Verdict.SKIP)
    assert not Prediction.parse("PASS").admits("REJECTED")
    assert Prediction.parse("PASS").admitting("REJECTED") == either
    assert either.admitting(Verdict.PASS) is either  # already admitted: unchanged, not repeated


@pytest.mark.parametrize("text, message", [
    ("PASS|MAYBE", "verdict 'MAYBE'; expected one of PASS, REJECTED, CORRUPT, HANG, CRASH, ERROR, SKIP$"),
    ("", "verdict ''; expected one of PASS, "),
    ("pass", "verdict 'pass'; expected one of PASS, "),  # the text is the verdict's name, exactly
    ("PASS|PASS", "each once"),
])
def test_a_prediction_text_naming_no_verdict_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        Prediction.parse(text)


def test_disagreements_read_the_prediction_from_its_text():
    frame = results.typed(pd.DataFrame({
        "case_id": ["a", "b", "c", "d"], "shape": ["", "", "", ""],
        "predicted": ["PASS|REJECTED", "PASS", "REJECTED", "PASS"],
        "verdict": ["REJECTED", "CORRUPT", "REJECTED", "SKIP"],
        "slice_bytes": [None] * 4, "host_bytes": [None] * 4, "bytes_moved": [None] * 4,
        "pending_at_construction": [None] * 4}))
    assert results.disagreements(frame)["case_id"].tolist() == ["b"]  # a SKIP neither agrees nor disagrees
    assert results.skipped(frame)["case_id"].tolist() == ["d"]


def test_a_results_row_says_the_verdict_and_prediction_as_text(tmp_path):
    case = next(c for c in build_cases(["v5e"], [], probes=("serving_step",)))
    assert prediction(case) == Prediction.parse(describe(case)["predicted"]) == Prediction(("PASS", "REJECTED"))
    frame = rows.to_frame([CaseResult(case, Outcome("PASS", "moved"), 0.1)], "run")
    [path] = results.write_runs(frame, tmp_path)
    [written] = csv.DictReader(path.open())
    assert (written["predicted"], written["verdict"]) == ("PASS|REJECTED", "PASS")
    read = results.read_run(path)
    assert read["verdict"].tolist() == ["PASS"] and Prediction.parse(read["predicted"].iloc[0]).admits("PASS")


def test_two_sides_earn_the_worse_verdict():
    worst = both_sides({"producer": Outcome("PASS", "sent"), "consumer": Outcome("CORRUPT", "wrong bytes")})
    assert worst.verdict is Verdict.CORRUPT
    assert worst.detail == "producer: PASS sent; consumer: CORRUPT wrong bytes"


def test_a_run_whose_folder_fills_up_mid_csv_leaves_no_torn_csv(tmp_path, monkeypatch):
    import errno

    case = next(c for c in build_cases(["v5e"], [], probes=("serving_step",)))
    frame = rows.to_frame([CaseResult(case, Outcome("PASS", "moved"), 0.1)], "run")
    [path] = results.write_runs(frame, tmp_path)
    whole = path.read_text()
    real = pd.DataFrame.to_csv

    def disk_fills_halfway(self, target, **kwargs):
        text = real(self, None, **kwargs)
        target_file = open(target, "w") if isinstance(target, (str, type(path))) else target
        target_file.write(text[:len(text) // 2])
        target_file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", disk_fills_halfway)
    with pytest.raises(OSError, match="No space left"):
        results.write_runs(frame.assign(detail="moved again"), tmp_path)
    assert path.read_text() == whole  # the run written before, whole
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # and nothing beside it
    path.unlink()
    with pytest.raises(OSError, match="No space left"):
        results.write_runs(frame, tmp_path)
    assert list(path.parent.iterdir()) == []  # no run at all, rather than a torn one
