"""An IUT cannot write a verdict: outside IUTs that print forged results (in
the probe, at exit, on stdout and stderr; one that prints at import is
refused before any case runs, tests/test_outside_iuts.py), fork a process that
writes to every descriptor, or find the worker's channel in memory and say a
second result, never change what the runner reports (probes.run.channel)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from kvref import ShapeKey
from probes.run.channel import Heard
from probes.run.runner import run_case
from probes.suite.cases import Case

FORGING_IUTS = textwrap.dedent('''
    import atexit, gc, json, os, sys
    import kvref
    from probes.iut.adapter import IUT
    from probes.iut.reference import KvrefLibrary, SimArrays

    # What the old protocol read as a result, and what the channel carries.
    FORGED = ['KVPROBE-RESULT {"verdict": "PASS", "detail": "forged"}',
              json.dumps({"token": "0" * 32, "kind": "result", "payload": {"verdict": "PASS", "detail": "forged"}})]

    def shout():
        for line in FORGED:
            print(line, flush=True)
            print(line, file=sys.stderr, flush=True)



    class Broken(KvrefLibrary):
        """The reference with its old slice formula: round trips come back corrupt."""

        def __init__(self, faults, options=None):
            super().__init__(kvref.Faults.parse(["legacy_slice_formula"]), options)


    class Prints(Broken):
        def manager(self, caches, host_blocks, **options):
            shout()
            atexit.register(shout)
            return super().manager(caches, host_blocks, **options)


    class Forks(Broken):
        def manager(self, caches, host_blocks, **options):
            if os.fork() == 0:
                for fd in range(3, 256):
                    for line in FORGED:
                        try:
                            os.write(fd, (line + "\\n").encode())
                        except OSError:
                            pass
                os._exit(0)
            return super().manager(caches, host_blocks, **options)


    class FindsTheChannel(Broken):
        def manager(self, caches, host_blocks, **options):
            for found in gc.get_objects():
                if type(found).__name__ == "Channel":
                    found.say("result", {"verdict": "PASS", "detail": "forged"})
            return super().manager(caches, host_blocks, **options)


    PRINTS = IUT("prints", SimArrays, Prints, targets=kvref.GENERATIONS)
    FORKS = IUT("forks", SimArrays, Forks, targets=kvref.GENERATIONS)
    FINDS_THE_CHANNEL = IUT("finds-the-channel", SimArrays, FindsTheChannel, targets=kvref.GENERATIONS)
''')


@pytest.fixture
def forging(tmp_path, monkeypatch):
    (tmp_path / "forging_iuts.py").write_text(FORGING_IUTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(sys.path)}")
    return "forging_iuts"


def verdict_of(iut: str, fresh: bool):
    """roundtrip on a shape the old slice formula corrupts (tests/test_probe_teeth.py)."""
    case = Case("roundtrip", "tpu7x", iut=iut, name="forged", shape=ShapeKey("bf16", (512, 6144)), timeout=20.0)
    return run_case(case, python=sys.executable if fresh else None).outcome


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "forked"])
def test_forged_results_printed_anywhere_leave_the_verdict_alone(forging, fresh):
    outcome = verdict_of(f"{forging}:PRINTS", fresh)
    assert outcome.verdict == "CORRUPT", outcome.detail
    assert "forged" not in outcome.detail


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "forked"])
def test_a_forked_process_writing_to_every_descriptor_makes_the_case_an_error_not_a_pass(forging, fresh):
    outcome = verdict_of(f"{forging}:FORKS", fresh)
    assert outcome.verdict == "ERROR", outcome.detail
    assert "without this case's token came over the verdict channel" in outcome.detail


def test_a_second_result_said_on_the_channel_itself_makes_the_case_an_error(forging):
    outcome = verdict_of(f"{forging}:FINDS_THE_CHANNEL", fresh=True)
    assert outcome.verdict == "ERROR", outcome.detail
    assert "2 results came over the verdict channel" in outcome.detail


def test_only_lines_with_the_token_are_heard():
    heard = Heard.parse('{"token": "t", "kind": "result", "payload": {"verdict": "PASS"}}\n'
                        'KVPROBE-RESULT {"verdict": "PASS"}\n'
                        '{"token": "u", "kind": "result", "payload": {}}\n', "t")
    assert heard.payloads("result") == [{"verdict": "PASS"}] and heard.forged == 2
    assert "2 line(s) without this case's token" in heard.tampered()
