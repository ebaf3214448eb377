"""The registries: every probe declared whole, every IUT's halves meeting the
adapter protocol, and unknown names refused with the known ones listed."""

import inspect

import numpy as np
import pytest

import kvref
from probes.iut import protocol
from probes.iut.registry import adapter_for, iut, usable_iuts
from probes.suite.matrix import build_cases, load_matrix
from probes.iut.protocol import CacheMode
from probes.suite.registry import PROBES, Scope, addressable_or_refused, probe
from probes.suite.verdicts import Prediction, Verdict


@pytest.mark.parametrize("name", PROBES)
def test_each_probe_is_declared_whole(name):
    p = PROBES[name]
    assert p.name == name and isinstance(p.scope, Scope)
    assert list(inspect.signature(p.run).parameters) == ["case", "iut"], "probes take (case, iut)"
    assert p.doc, f"{name} says in its docstring what it checks"
    if p.scope in (Scope.SHAPE, Scope.FUZZ):
        assert p.subject is None and not p.kinds
    else:
        assert isinstance(p.subject, kvref.ShapeKey), f"{name} needs a fixed subject"
    assert bool(p.kinds) == (p.scope == Scope.ROBUSTNESS)
    contiguous, interleaved = (p.predict(kvref.tpu_layout("bf16", dims, "tpu7x"))
                               for dims in ((512, 16, 2048), (512, 3, 2048)))
    for predicted in (contiguous, interleaved):
        assert isinstance(predicted, Prediction) and not predicted.admits(Verdict.SKIP), predicted
    if p.predict is addressable_or_refused:  # the layout decides: rows that are byte ranges move
        assert (str(contiguous), str(interleaved)) == ("PASS", "REJECTED"), name
    else:  # a fixed prediction says so, whatever the layout
        assert contiguous == interleaved and p.predict.__doc__.startswith(" or ".join(contiguous.verdicts)), name


def test_cases_come_from_the_registry_alone():
    cases = build_cases(["tpu7x"], load_matrix("default"), probes=tuple(PROBES))
    made = {c.probe for c in cases}
    assert made == {name for name, p in PROBES.items() if p.scope != Scope.FUZZ and iut("kvref-sim").applies(name)}
    for c in cases:
        assert c.shape is not None, c.case_id
        assert (c.kind in PROBES[c.probe].kinds) if PROBES[c.probe].kinds else c.kind == ""


def test_unknown_probe_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown probe 'teleport'; expected one of roundtrip, "):
        probe("teleport")


@pytest.mark.parametrize("name", usable_iuts())
def test_each_iut_meets_the_protocol(name):
    declared = iut(name)
    assert protocol.missing_members(declared.arrays, protocol.Arrays) == []
    assert protocol.missing_members(declared.library, protocol.Library) == []
    assert callable(getattr(declared.arrays, "donating_step", None))  # optional for others; every IUT here has it
    declared.arrays(declared.targets[0]), declared.library(kvref.Faults())  # construct without a device
    shape, source = declared.layout_of(declared.targets[0], kvref.ShapeKey("bf16", (512, 16, 2048)))
    assert isinstance(shape, kvref.Shape) and source


def test_protocol_check_names_a_missing_part():
    class NoScramble:
        backend = "none"
        scrambles_in_place = False
        device_kind = ""
        layout_of = staticmethod(lambda generation, key: None)

        def __init__(self, generation): ...

        def skip_reason(self): ...

        def make_caches(self, key, seeds, mode="put", finite=False): ...

        def fetch(self, cache): ...

        def is_pending(self, cache): ...

        def serving_step(self, cache, new): ...

        def dispatch_step(self, cache, new): ...

        def hold_copies(self, cache, seconds): ...

        def read_by_step(self, cache): ...

        def views(self, key, seeds): ...

    assert protocol.missing_members(NoScramble, protocol.Arrays) == ["scramble"]


def test_an_entry_point_and_its_iut_carry_one_name(monkeypatch):
    """The name is declared by both the IUT and its entry point; one never
    silently replaces the other."""
    from importlib import metadata

    from probes.iut import registry

    point = metadata.EntryPoint("renamed", "probes.iut.declared:KVREF_SIM", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: {"renamed": [point]})
    monkeypatch.setattr(registry, "RESOLVED", {})
    with pytest.raises(registry.IUTError, match="loads an IUT named 'kvref-sim'; an entry point's name is the name "
                                                "of the IUT it loads"):
        iut("renamed")


def test_unknown_iut_and_faults_are_refused():
    with pytest.raises(ValueError, match=r"unknown implementation under test 'nope'; expected one of \["):
        iut("nope")
    with pytest.raises(ValueError, match=r"unknown fault model\(s\) \['bogus'\]; expected any of \["):
        kvref.Faults.parse("bogus")
    with pytest.raises(ValueError, match="tpu-sync-jax has no fault models"):
        iut("tpu-sync-jax").check_faults(kvref.Faults(legacy_slice_formula=True))
    with pytest.raises(ValueError, match="tpu-sync-jax runs on cpu, not 'v5e'"):
        iut("tpu-sync-jax").check_target("v5e")


def test_faults_are_one_value():
    faults = kvref.Faults.parse(["allow_mixed_slices", " legacy_slice_formula"], environ={})
    assert faults.allow_mixed_slices and faults.legacy_slice_formula and not faults.no_host_budget
    assert faults.names == ("legacy_slice_formula", "allow_mixed_slices")  # declaration order
    assert kvref.Faults.parse(str(faults), environ={}) == faults
    assert kvref.Faults.parse((), environ={"KVREF_FAULTS": "no_host_budget"}).no_host_budget
    assert not kvref.Faults() and set(kvref.FAULTS) == set(kvref.Faults.known())


def test_an_adapter_hands_each_call_to_its_half():
    adapter = adapter_for("kvref-sim", "v5e")
    key = kvref.ShapeKey("bf16", (64, 8, 128))
    cache, host = adapter.make_cache(key, seed=1, mode="deferred")
    assert adapter.is_pending(cache)  # really pending: DEFER_AND_FUSE
    assert adapter.fetch(cache).tobytes() == host.tobytes()
    assert not adapter.is_pending(cache)
    assert adapter.layout(key) == kvref.tpu_layout("bf16", (64, 8, 128), "v5e")


@pytest.mark.parametrize("dtype, low, high", [("pred", 0, 1), ("s4", -8, 7), ("u4", 0, 15)])
def test_random_contents_stay_within_the_type(dtype, low, high):
    from probes.iut.host_data import random_host

    values = random_host(kvref.ShapeKey(dtype, (64, 32)), seed=3).astype(np.int64)
    assert values.min() == low and values.max() == high  # the whole range, nothing outside it
    if dtype == "pred":  # a bool byte other than 0 or 1 is not a value the type has
        assert random_host(kvref.ShapeKey(dtype, (64, 32)), seed=3).view(np.uint8).max() == 1


def test_a_probe_or_outcome_declared_wrong_fails_where_it_is_declared():
    from probes.suite.registry import Probe, always
    from probes.suite.verdicts import Outcome

    with pytest.raises(ValueError, match="probe 'p' has scope 'shapes'; expected one of shape, generation, "
                                         "robustness, fuzz$"):
        Probe("p", lambda case, iut: None, "shapes", always("PASS"))
    with pytest.raises(ValueError, match="only one, has kinds"):
        Probe("p", lambda case, iut: None, "generation", always("PASS"), kinds=("a",))
    with pytest.raises(ValueError, match="verdict 'FAIL'; expected one of PASS, REJECTED, CORRUPT, HANG, CRASH, "
                                         "ERROR, SKIP$"):
        Outcome("FAIL")
    with pytest.raises(ValueError, match="verdict 'FAIL'; expected one of PASS, "):
        always("PASS", "FAIL")
    # Text naming one is taken, and held as the enum from then on.
    declared = Probe("p", lambda case, iut: None, "generation", always("PASS"))
    assert declared.scope is Scope.GENERATION and declared.predict(None).verdicts == (Verdict.PASS,)
    assert Outcome("REJECTED").verdict is Verdict.REJECTED


def test_a_cache_mode_is_checked_where_the_adapter_is_asked():
    """Outside IUTs and probes may name a mode as text; the adapter refuses an
    unknown one, naming the modes, and hands its half the enum."""
    adapter = adapter_for("kvref-sim", "v5e")
    key = kvref.ShapeKey("bf16", (64, 8, 128))
    with pytest.raises(ValueError, match="cache mode 'lazy'; expected one of put, landing, deferred$"):
        adapter.make_cache(key, seed=1, mode="lazy")
    asked = []
    made = adapter.arrays.make_caches
    adapter.arrays.make_caches = lambda key, seeds, mode, finite: asked.append(mode) or made(key, seeds, mode, finite)
    adapter.make_cache(key, seed=1, mode="landing")
    adapter.make_cache(key, seed=1)
    assert asked == [CacheMode.LANDING, CacheMode.PUT] and all(type(m) is CacheMode for m in asked)
