"""An IUT cannot write a verdict: outside IUTs that print forged results (in
the probe, at exit, on stdout and stderr; one that prints at import is
refused before any case runs, tests/probes/test_outside_iuts.py), fork a process that
writes to every descriptor, or find the worker's channel in memory and say a
second result, never change what the runner reports (probes.run.channel)."""

from __future__ import annotations

import sys

import pytest

from kvref import ShapeKey
from probes.fuzz.verdict_forgery import forging_module
from probes.run.channel import Heard
from probes.run.runner import run_case
from probes.suite.cases import Case

# Each an IUT with the old slice formula whose manager, at the probe's call, tries to forge its verdict.
FORGERS = {"prints": ["prints", "prints_at_exit"], "forks": ["forks_and_writes"],
           "finds_the_channel": ["says_on_the_channel"]}


@pytest.fixture
def forging(tmp_path, monkeypatch):
    for name, behaviours in FORGERS.items():
        (tmp_path / f"forging_{name}.py").write_text(forging_module(behaviours, name.replace("_", "-")))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(sys.path)}")
    return "forging"


def verdict_of(iut: str, fresh: bool):
    """roundtrip on a shape the old slice formula corrupts (tests/probes/test_probe_teeth.py)."""
    case = Case("roundtrip", "tpu7x", iut=iut, name="forged", shape=ShapeKey("bf16", (512, 6144)), timeout=20.0)
    return run_case(case, python=sys.executable if fresh else None).outcome


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "forked"])
def test_forged_results_printed_anywhere_leave_the_verdict_alone(forging, fresh):
    outcome = verdict_of(f"{forging}_prints:IUT", fresh)
    assert outcome.verdict == "CORRUPT", outcome.detail
    assert "forged" not in outcome.detail


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "forked"])
def test_a_forked_process_writing_to_every_descriptor_makes_the_case_an_error_not_a_pass(forging, fresh):
    outcome = verdict_of(f"{forging}_forks:IUT", fresh)
    assert outcome.verdict == "ERROR", outcome.detail
    assert "without this case's token came over the verdict channel" in outcome.detail


def test_a_second_result_said_on_the_channel_itself_makes_the_case_an_error(forging):
    outcome = verdict_of(f"{forging}_finds_the_channel:IUT", fresh=True)
    assert outcome.verdict == "ERROR", outcome.detail
    assert "2 results came over the verdict channel" in outcome.detail


def test_only_lines_with_the_token_are_heard():
    heard = Heard.parse('{"token": "t", "kind": "result", "payload": {"verdict": "PASS"}}\n'
                        'KVPROBE-RESULT {"verdict": "PASS"}\n'
                        '{"token": "u", "kind": "result", "payload": {}}\n', "t")
    assert heard.payloads("result") == [{"verdict": "PASS"}] and heard.forged == 2
    assert "2 line(s) without this case's token" in heard.tampered()


def test_a_line_the_json_reader_cannot_take_is_a_forged_line_not_the_runs_end():
    """Nesting deeper than the reader recurses ended the whole run, every case's verdict lost."""
    deep = "[" * 100_000 + "]" * 100_000
    heard = Heard.parse('{"token": "t", "kind": "result", "payload": {"verdict": "PASS"}}\n' + deep + "\n", "t")
    assert heard.payloads("result") == [{"verdict": "PASS"}] and heard.forged == 1
    assert "1 line(s) without this case's token" in heard.tampered()
