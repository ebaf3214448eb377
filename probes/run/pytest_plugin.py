"""kvprobe as a pytest plugin (entry point `pytest11: kvprobe` of the
distribution pytest-kvprobe, plugins/pytest-kvprobe), for a team's own CI,
in any repository where kvref and pytest-kvprobe are installed:

    pytest --kvprobe-iut NAME_OR_MODULE:ATTR [--kvprobe-generation G] [--kvprobe-matrix M]
           [--kvprobe-probe P,...] [--kvprobe-out DIR] [-m tpu]

Every case is one test item, `kvprobe/<iut>/<how its manager is built>::<case id>`
(the case id of the CSVs), collected and counted as pytest counts any item,
and run in a watched worker exactly as `kvprobe run` runs it: the selected
cases start together, as many at once as `kvprobe run` runs (one at a time
on a real TPU), and each item reports its own. Under pytest-xdist each
worker leaves its rows where the controller reads them, and the controller
writes one run of every case. It passes only when the
verdict is one the reference predicts; its
verdict, prediction and detail are the item's properties (so `--junitxml`
carries them). A SKIP is a pytest skip with the worker's reason, except for a
case of an IUT that owns a real TPU (those items are marked `tpu`) on a
machine with a TPU, which fails. With `--kvprobe-out` the CSVs and reports
are written as `kvprobe run` writes them. Without `--kvprobe-iut` the plugin
does nothing."""

from __future__ import annotations

import argparse
import shutil
import signal
import threading
from pathlib import Path

import pytest

from probes.suite.verdicts import SKIP

GROUP = "kvprobe"
TPU_MARK = "tpu"
PARTS = ".kvprobe-parts"  # under --kvprobe-out: each xdist worker's rows of the run, until the controller merges them


def pytest_addoption(parser):
    from probes.run import options

    group = parser.getgroup(GROUP, "qualify a KV-cache manager with kvprobe")
    # The IUT names and generations are read as text: 'local' is resolved per IUT (cases).
    options.add_to_pytest(group, "iut", "generation", "matrix", "probe", "jobs", "timeout", "faults", "out",
                          raw=("iut", "generation"), iut=None, generation=None, out=None)


def pytest_configure(config):
    # What the plugin's items carry, registered as a plugin's markers are (--strict-markers, -m tpu).
    config.addinivalue_line("markers", f"{TPU_MARK}: a kvprobe case of an IUT that runs on real TPU hardware")
    from probes.run import options

    try:
        options.check_given({name: config.getoption(f"kvprobe_{name}") for name in options.OPTIONS
                             if hasattr(config.option, f"kvprobe_{name}")}, prefix="--kvprobe-")
    except ValueError as e:
        raise pytest.UsageError(f"kvprobe: {e}") from None
    if config.getoption("kvprobe_iut"):
        config.pluginmanager.register(KvprobeRun(config), "kvprobe-run")


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    """A kvprobe item's node id, as pytest prints it, names that item: it is
    no file, so it is taken from the paths pytest collects and kept as the
    items to select."""
    run = session.config.pluginmanager.get_plugin("kvprobe-run")
    if run is None:
        return
    named = [arg for arg in session.config.args if arg.startswith("kvprobe/")]
    if named:
        run.named = named
        session.config.args[:] = [arg for arg in session.config.args if not arg.startswith("kvprobe/")]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist, on the controller: the run each worker's rows belong to."""
    run = node.config.pluginmanager.get_plugin("kvprobe-run")
    if run is not None:
        node.workerinput["kvprobe_run_id"] = run.run_id
        node.workerinput["kvprobe_testpaths"] = run.from_testpaths()


class CaseFailed(Exception):
    """A case's verdict is not one the reference predicts (or it skipped on a TPU)."""


class KvprobeRun:
    """The cases of one pytest session, and what they found."""

    def __init__(self, config):
        self.config = config
        self.found = []  # CaseResult, in the order the items ran
        self.not_run: list[tuple[str, str]] = []  # (IUT, why) for an IUT this TPU is no target of
        self.selected: list = []  # the CaseItems left after -k and -m, in the order they run
        self.pools = None  # probes.run.runner.CasePools, made when the first item runs
        self.running: dict = {}  # id(CaseItem) -> the future of its case's result
        self.named: list[str] = []  # kvprobe node ids given as paths: only those items (and their groups') run
        self.sigterm = None  # the SIGTERM handler the session had before its cases (restored at its end)
        from probes.run import rows

        worker = getattr(config, "workerinput", None)  # an xdist worker: the controller's run
        self.run_id = worker.get("kvprobe_run_id") if worker and "kvprobe_run_id" in worker else rows.new_run_id()
        self.worker = worker["workerid"] if worker else None

    def cases(self) -> list:
        from probes.iut import TpuUnavailable
        from probes.run import command

        iuts = [name for name in self.config.getoption("kvprobe_iut").split(",") if name]
        try:
            option = self._option
            chosen = {name: self._generations(name) for name in iuts}
            return [case for name, generations in chosen.items() if generations
                    for case in command.prepare(generations, [name], option("kvprobe_matrix"),
                                                option("kvprobe_probe"), option("kvprobe_timeout"),
                                                option("kvprobe_faults"), option("kvprobe_out"))]
        except (ValueError, OSError, argparse.ArgumentTypeError, TpuUnavailable) as e:  # OSError: --kvprobe-out
            raise pytest.UsageError(f"kvprobe: {e}") from None

    def _option(self, dest: str):
        """An option's value, parsed as the options table says also where a
        conftest set it as text (config.option.kvprobe_probe = "all")."""
        from probes.run import options

        value = self.config.getoption(dest)
        parse = options.OPTIONS[dest.removeprefix("kvprobe_")].parse
        return parse(value) if isinstance(value, str) and parse is not None else value

    def _generations(self, name: str) -> list[str]:
        from probes.iut import iut, local_generation, tpu_visible
        from probes.run import options

        declared, given = iut(name), self.config.getoption("kvprobe_generation")
        if declared.owns_device and (given is None or given == "local"):
            # Without a TPU its items are made on a target anyway, to skip with the one reason.
            if not tpu_visible():
                return [declared.targets[0]]
            local = local_generation()
            if not declared.runs_on(local):  # this TPU is not one of its targets: one skipped item says so
                self.not_run.append((name, f"{name} does not run on this {local} TPU: it runs on "
                                     f"{', '.join(declared.targets)}"))
                return []
            return [local]
        return options.generations(given) if given else list(declared.targets)

    @pytest.hookimpl(tryfirst=True)  # before -m and -k deselect: they apply to these items too
    def pytest_ignore_collect(self, collection_path, config):
        """Where no path was named (pytest took its `testpaths`), the kvprobe
        items alone: a team's own tests run when it names them."""
        return True if self.from_testpaths() else None

    def from_testpaths(self) -> bool:
        worker = getattr(self.config, "workerinput", None)  # xdist: as the controller was started
        if worker is not None and "kvprobe_testpaths" in worker:
            return worker["kvprobe_testpaths"]
        return self.config.args_source == pytest.Config.ArgsSource.TESTPATHS

    def pytest_collection_modifyitems(self, session, config, items):
        groups: dict[str, tuple[pytest.Collector, list]] = {}
        for case in self.cases():
            label = f"kvprobe/{case.iut}/{case.options_text}"
            if label not in groups:
                groups[label] = (CaseGroup.from_parent(session, name=label, nodeid=label), [])
            group, members = groups[label]
            members.append(CaseItem.from_parent(group, name=case.case_id, case=case, run=self))
        for name, why in self.not_run:
            group = CaseGroup.from_parent(session, name=f"kvprobe/{name}", nodeid=f"kvprobe/{name}")
            groups[group.nodeid] = (group, [NotATarget.from_parent(group, name="this-tpu", why=why)])
        for group, members in groups.values():
            if self.named:
                members = [m for m in members if any(m.nodeid == n or m.nodeid.startswith(n.rstrip("/") + "::")
                                                     or n == group.nodeid for n in self.named)]
            items += members
            # Said as a collector's report is, so pytest counts them as collected ("collected N items").
            config.hook.pytest_collectreport(report=pytest.CollectReport(group.nodeid, "passed", None, members))

    def pytest_collection_finish(self, session):
        self.selected = [item for item in session.items if isinstance(item, CaseItem)]
        if self.selected and self.worker is None and threading.current_thread() is threading.main_thread():
            # SIGTERM (a CI job cancelled, a pod stopped) ends the session as Ctrl-C does: the cases that ran
            # are reported and written (junitxml, --kvprobe-out), no worker is left; not pytest's instant death.
            self.sigterm = signal.signal(signal.SIGTERM, _interrupt)

    def result_of(self, item) -> object:
        """The case's result: the selected cases start together at the first
        item that runs, as many at once as `kvprobe run` runs them."""
        from probes.run.runner import CasePools

        if self.pools is None:
            cases = [i.case for i in self.selected] or [item.case]
            self.pools = CasePools(cases, self.config.getoption("kvprobe_jobs"))
            self.running = {id(i): self.pools.start(i.case) for i in self.selected}
        if id(item) not in self.running:  # an item run apart from its session's selection
            self.running[id(item)] = self.pools.start(item.case)
        return self.running[id(item)].result()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        """A case item's call lasted as long as its case ran (junitxml's `time`), not
        as long as the item waited for a case that ran beside the others."""
        made = yield
        seconds = getattr(item, "case_seconds", None)
        if call.when == "call" and seconds is not None:
            made.get_result().duration = seconds

    def pytest_sessionfinish(self, session, exitstatus):
        if self.sigterm is not None:
            signal.signal(signal.SIGTERM, self.sigterm)
        if self.pools is not None:  # a session stopped early (-x, Ctrl-C): no queued case starts
            self.pools.shutdown(stop=True)
            if exitstatus == pytest.ExitCode.INTERRUPTED:  # and none runs on: its thread would hold the exit
                from probes.run.forked import kill_live

                kill_live()
        out = self.config.getoption("kvprobe_out")
        if not out:
            return
        from probes.report.atomic import write_whole
        from probes.report.results import read_run
        from probes.run import command, rows

        parts = Path(out) / PARTS / self.run_id
        if self.worker is not None:  # the controller writes the run, with every worker's rows
            if self.found:
                frame = rows.to_frame(self.found, self.run_id)
                write_whole(parts / f"{self.worker}.csv", lambda f: frame.to_csv(f, index=False))
            return
        frames = [rows.to_frame(self.found, self.run_id)] if self.found else []
        frames += [read_run(part) for part in sorted(parts.glob("*.csv"))]
        if frames:
            import pandas as pd

            command.record_frame(pd.concat(frames, ignore_index=True), Path(out))
        shutil.rmtree(parts, ignore_errors=True)
        try:
            parts.parent.rmdir()  # gone once no other run's parts are in it
        except OSError:
            pass


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def item_timeout(case, configured) -> float:
    """pytest-timeout's limit for a case's item: never shorter than the
    runner's own (start-up, the case, the grace to kill it), with a margin."""
    from probes.run.runner import GRACE_SECONDS

    return max(float(configured or 0), case.startup_timeout + case.timeout + GRACE_SECONDS + 30.0)


class CaseGroup(pytest.Collector):
    """The cases of one IUT built one way."""

    def collect(self):
        return []


class NotATarget(pytest.Item):
    """An IUT whose targets leave out this machine's TPU: skipped, with why."""

    def __init__(self, *, why: str, **kwargs):
        super().__init__(**kwargs)
        self.why = why
        self.add_marker(TPU_MARK)

    def runtest(self):
        pytest.skip(self.why)

    def reportinfo(self):
        return self.path, None, self.why


class CaseItem(pytest.Item):
    def __init__(self, *, case, run: KvprobeRun, **kwargs):
        super().__init__(**kwargs)
        from probes.iut import iut

        self.case, self.run = case, run
        self.on_hardware = iut(case.iut).owns_device
        if self.on_hardware:
            self.add_marker(TPU_MARK)
        if self.config.pluginmanager.hasplugin("timeout"):  # pytest-timeout must outlast the runner's own limit
            self.add_marker(pytest.mark.timeout(item_timeout(case, self.config.getini("timeout"))))

    def runtest(self):
        from probes.iut import NO_TPU, tpu_visible
        from probes.run.forked import kill_live
        from probes.suite.predict import prediction

        tpu_here = tpu_visible()
        if self.on_hardware and not tpu_here:
            pytest.skip(NO_TPU)  # one reason for every hardware case
        try:
            result = self.run.result_of(self)
        except BaseException as e:  # pytest-timeout or Ctrl-C: no worker outlives its item (it would hold the TPU)
            if isinstance(e, KeyboardInterrupt) and self.run.pools is not None:  # and no queued case starts
                self.run.pools.shutdown(stop=True)
            kill_live()
            raise
        self.run.found.append(result)
        self.case_seconds = result.wall_seconds
        outcome, predicted = result.outcome, prediction(self.case)
        self.user_properties += [("verdict", str(outcome.verdict)), ("predicted", str(predicted)),
                                 ("detail", outcome.detail.strip()[:4000])]
        if outcome.verdict == SKIP:
            if self.on_hardware and tpu_here:
                raise CaseFailed(f"SKIP on a machine with a TPU: {outcome.detail.strip()}")
            pytest.skip(outcome.detail.strip()[:1000] or "SKIP")
        if not predicted.admits(outcome.verdict):
            raise CaseFailed(f"{outcome.verdict}, predicted {predicted}: {outcome.detail.strip()[:4000]}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return f"{self.case.iut} {self.case.case_id}: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"kvprobe {self.case.iut} {self.case.case_id}"
