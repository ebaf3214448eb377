"""The fuzz campaign: a short run over every category finds nothing, and a
crash or a hang is pinned to the input that caused it while the campaign goes on.
`make fuzz` runs the 100,000-input campaign."""

import json

import numpy as np

from probes.fuzz import campaign
from probes.fuzz.kvref_api import CATEGORIES


def test_a_short_campaign_finds_nothing():
    tallies = campaign.campaign(total=1800, seed=2024)
    assert sum(t.inputs for t in tallies) >= 1800
    assert {t.category for t in tallies} == set(CATEGORIES)
    for t in tallies:
        assert not t.failures, campaign.render(tallies, 1.0)
        assert t.refused and t.accepted, f"{t.category} exercised only one side"


def test_a_crash_is_pinned_to_its_input_and_the_campaign_goes_on(tmp_path):
    tally = campaign.run_category("tests.fuzz_standins:Crashes", 12, seed=7, log_dir=tmp_path)
    crashing = [i for i in range(12) if np.random.default_rng([7, i]).integers(0, 4) == 3]
    assert crashing and tally.inputs == 12
    assert [f["index"] for f in tally.failures] == crashing
    assert all(f["event"] == "crash" and f["input"] == {"value": 3} for f in tally.failures)
    assert tally.accepted == 12 - len(crashing)


def test_a_hang_is_pinned_too(tmp_path, monkeypatch):
    monkeypatch.setattr(campaign, "INPUT_SECONDS", 1.0)
    tally = campaign.run_category("tests.fuzz_standins:Hangs", 6, seed=3, log_dir=tmp_path)
    hanging = [i for i in range(6) if np.random.default_rng([3, i]).integers(0, 4) == 2]
    assert [(f["index"], f["event"]) for f in tally.failures] == [(i, "hang") for i in hanging]
    assert "Timeout" in tally.failures[0]["detail"] if hanging else True
    assert json.dumps(tally.failures)  # every failure keeps its input as data
