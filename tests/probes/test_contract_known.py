"""What a contract campaign knows: a failure's key (where it arises), the
pattern of its shrunk sequence, and draws steered away from it."""

import numpy as np

from probes.suite.contract_known import Key, Known, Pattern, key_of, reason_of, signature, top_frames

SAVE = {"rule": "save", "blocks": [1, 2], "sizes": None, "wait": False}
STEP = {"rule": "model_step", "layer": 0, "how": "donate_moved", "seed": 7}
D2H = {"rule": "transfer", "d2h": True, "src": [1], "dst": [2], "sizes": [2], "wait": True}


def test_a_step_is_signed_by_its_rule_and_choices_never_its_numbers():
    assert signature(SAVE) == "save blocks sizes=None wait=False"
    assert signature(STEP) == "model_step how=donate_moved layer seed"
    assert signature({**STEP, "layer": 1, "seed": 99}) == signature(STEP)
    assert signature({"rule": "pull", "req": "req-12", "uuid": 5, "early": True}) == "pull early=True req uuid"
    assert signature(D2H) != signature({**D2H, "d2h": False}) != signature({**D2H, "wait": False})


def test_a_pattern_is_completed_by_its_last_step_after_the_rest_in_order():
    pattern = Pattern("put", (signature(SAVE), signature(STEP)))
    drawn = [signature(D2H), signature(SAVE), signature(D2H)]
    assert pattern.completed_by("put", drawn, signature(STEP))
    assert not pattern.completed_by("deferred", drawn, signature(STEP))  # caches of another mode
    assert not pattern.completed_by("put", [signature(D2H)], signature(STEP))  # no save before it
    assert not pattern.completed_by("put", drawn, signature(SAVE))
    assert not Pattern("put", (signature(STEP), signature(SAVE), signature(STEP))).completed_by(
        "put", [signature(SAVE), signature(STEP)], signature(STEP))  # out of order


def test_a_crash_is_keyed_by_its_signal_its_step_and_its_top_frames():
    stderr = ("step 3 {}\nFatal Python error: Segmentation fault\n\nThread 0x01 (most recent call first):\n"
              '  File "/a/threading.py", line 3 in wait\n\nCurrent thread 0x02 (most recent call first):\n'
              '  File "/site/tpu_sync/manager.py", line 88 in d2h\n  File "/w/probes/iut/tpu_sync.py", line 12 in '
              'd2h\n  File "/w/probes/suite/contract_rules.py", line 190 in transfer\n  File "/w/x.py", line 1 in f\n')
    assert top_frames(stderr) == ("manager.py:d2h", "tpu_sync.py:d2h", "contract_rules.py:transfer")
    key = key_of("CRASH", "killed by SIGSEGV", {"spec": {"mode": "deferred"}, "steps": [SAVE, D2H]}, None, stderr)
    assert key == Key("CRASH", "transfer on deferred caches", "killed by SIGSEGV", top_frames(stderr))
    # How the step was asked (awaited or not) is not where it arises; the caches' mode is.
    assert key_of("CRASH", "killed by SIGSEGV", {"spec": {"mode": "deferred"}, "steps": [{**D2H, "wait": False}]},
                  None, stderr) == key
    assert key_of("CRASH", "killed by SIGSEGV", {"spec": {"mode": "put"}, "steps": [D2H]}, None, stderr) != key
    # A finding kept before frames were recorded is the same place; another signal, or other frames, is not.
    where = "transfer on deferred caches"
    assert key.same_as(Key("CRASH", where, "killed by SIGSEGV"))
    assert not key.same_as(Key("CRASH", where, "killed by SIGABRT"))
    assert not key.same_as(Key("CRASH", where, "killed by SIGSEGV", ("a.py:f",)))
    assert not key.same_as(Key("CRASH", "save on deferred caches", "killed by SIGSEGV"))
    # A refusal that is missing is the same wherever the caches stand.
    refused = "step 0 {}: unlock [0]: accepted; it must be refused (chunk 0 is not locked)"
    assert key_of("ERROR", refused, {"spec": {"mode": "deferred"}, "steps": [SAVE]}, 0) == \
        key_of("ERROR", refused, {"spec": {"mode": "put"}, "steps": [SAVE]}, 0) == \
        Key("ERROR", "save", "accepted; it must be refused (chunk N is not locked)")


def test_a_reason_loses_its_numbers_lists_and_quotes_and_keeps_why():
    assert reason_of('step 4 {"rule": "unlock", "ids": [0]}: unlock [0]: accepted; it must be refused (chunk 0)') \
        == reason_of('step 9 {"rule": "unlock", "ids": [7]}: unlock [7, 8]: accepted; it must be refused (chunk 7)') \
        == "accepted; it must be refused (chunk N)"
    assert reason_of("step 0 {}: h2d [7] -> [3] sizes [0]: accepted; it must be refused (copy size 0)") != \
        reason_of("step 0 {}: h2d [7] -> [3] sizes None: accepted; it must be refused (range out of the cache)")


def test_a_crash_s_pattern_holds_its_steps_by_rule_alone():
    pattern = Pattern.of({"spec": {"mode": "deferred"}, "steps": [D2H]}, rules_only=True)
    assert pattern == Pattern("deferred", ("transfer",))
    assert pattern.completed_by("deferred", [], signature({**D2H, "d2h": False, "wait": False}))
    assert not pattern.completed_by("deferred", [], signature(SAVE))


def test_a_step_that_would_complete_a_pattern_is_drawn_again_or_of_another_rule():
    known = Known([], [Pattern("put", (signature(SAVE),))])
    rng = np.random.default_rng(0)
    asked = []

    def draw(only):
        asked.append(only)
        if only:
            return STEP if "model_step" in only else None
        return SAVE if rng.random() < 0.95 else D2H

    for _ in range(50):
        step = known.draw(draw, "put", [], ("save", "model_step", "transfer"), lambda rule: rule)
        assert step is not None and step != SAVE
    assert known.steered > 50 and ("model_step", "transfer") in asked
    # On caches of another mode the pattern does not hold: the first draw stands.
    assert Known([], [Pattern("put", (signature(SAVE),))]).draw(lambda only: SAVE, "deferred", [], ("save",),
                                                                  lambda rule: rule) == SAVE
    # Where every rule's step completes a pattern, none is drawn: the sequence ends.
    assert Known([], [Pattern("put", (signature(SAVE),))]).draw(lambda only: SAVE, "put", [], ("save",),
                                                                  lambda rule: rule) is None


def test_known_failures_cross_processes_as_data():
    known = Known([Key("CRASH", "save", "killed by SIGSEGV", ("a.py:f",))], [Pattern("put", ("save",))])
    again = Known.from_json(known.to_json())
    assert again.keys == known.keys and again.patterns == known.patterns
    assert not again.add(Key("CRASH", "save", "killed by SIGSEGV", ("a.py:f",)), None)
    assert again.repeats == {known.keys[0].text(): 1}


def test_the_kept_contract_findings_are_known_to_a_campaign_that_names_their_folder():
    from pathlib import Path

    from probes.run.campaign import known_in

    folder = Path(__file__).resolve().parents[2] / "reports" / "cpu" / "findings"
    kept = sorted(folder.glob("contract-*.json"))
    known = known_in(folder)
    assert kept and len(known.keys) == len(kept) and len(known.patterns) == len(kept)
