"""A finding of `kvprobe fuzz` kept as data, whichever model found it: one
JSON file (reports/<generation>/findings/<model>-<iut>-<verdict>-<n>.json)
holding the case that failed, shrunk (its call sequence, or its contract
sequence), the verdict and its reason with the worker's output and the
library's log lines taken out, where it was found, and every way the manager
was built (option set) it failed alike under. A failure of a case already
found under another option set adds that set to the finding instead of
writing another."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from probes.report.paths import file_safe
from probes.run.finding_schema import check_finding
from probes.run.worker import PHASE_PROBE
from probes.suite.cases import Case

# Which model each probe that runs a sequence is; a finding is named after it.
MODELS = {"call_sequence": "blocks", "contract_sequences": "contract"}
FIELDS = {"model", "iut", "iut_version", "verdict", "detail", "found_in", "option_sets", "case"}
# The library's log lines (glog's prefix), where a worker's output tail follows a reason.
LOG_LINE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before absl)")
DETAIL_CHARS = 1500
NUMBERED = re.compile(r"-(\d+)\.json$")
MOST_FINDING_BYTES = 16 << 20  # read at most this much of a finding file (a shrunk sequence is KiBs)
MAX_NUMBERS = 1000  # names tried past the highest taken, when other campaigns write beside this one


def stripped(detail: str) -> str:
    """A failure's reason, without the worker's output after it (which starts
    at the worker's phase marker) or the library's log lines, at most DETAIL_CHARS."""
    reason = detail.strip().split(PHASE_PROBE, 1)[0]
    return "\n".join(line for line in reason.strip().splitlines() if not LOG_LINE.match(line))[:DETAIL_CHARS]


def write_finding(case: Case, verdict: str, detail: str, iut_version: str, found_in: str, directory: Path,
                  extra: dict | None = None) -> Path:
    """`case`'s failure as data: a new finding in `directory`, or the one of
    the same case failing alike under another option set, with this set added.
    `extra`: fields of its model's own (a contract finding's key and pattern)."""
    model = MODELS[case.probe]
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{model}-{file_safe(case.iut)}-{verdict.lower()}"
    detail = stripped(detail)
    options = [list(pair) for pair in case.iut_options]
    plain = json.loads(case.to_json())
    for path in sorted(directory.glob(f"{stem}-*.json")):
        known = _readable(path)
        if known and {**known["case"], "iut_options": []} == {**plain, "iut_options": []} \
                and known["detail"] == detail:
            add_option_set(path, case)
            return path
    text = json.dumps({"model": model, "iut": case.iut, "iut_version": iut_version, "verdict": str(verdict),
                       "detail": detail, "found_in": found_in, "option_sets": [options], "case": plain,
                       **(extra or {})}, indent=1) + "\n"
    taken = [int(m.group(1)) for p in directory.glob(f"{stem}-*.json") if (m := NUMBERED.search(p.name))]
    first = max(taken, default=0) + 1  # after the highest: a finding deleted never frees its number
    for n in range(first, first + MAX_NUMBERS):
        path = directory / f"{stem}-{n}.json"
        if _created(path, text):
            return path
    raise OSError(f"{directory}: {stem}-{first}.json to -{first + MAX_NUMBERS - 1}.json are all taken")


def _readable(path: Path) -> dict | None:
    """A finding's fields, or None for a file that is not one (torn, or someone else's)."""
    try:
        known = read_json(path)
    except ValueError:
        return None
    return known if isinstance(known, dict) and isinstance(known.get("case"), dict) else None


def _created(path: Path, text: str) -> bool:
    """`text` as a new file at `path`, whole or not at all; False where the name is taken."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text)
    try:
        os.link(part, path)  # fails, rather than replaces, where another finding holds the name
    except FileExistsError:
        return False
    finally:
        part.unlink(missing_ok=True)
    return True


def add_option_set(path: Path, case: Case) -> None:
    """The finding at `path` failed alike under `case`'s way of building the manager too."""
    known = json.loads(path.read_text())
    options = [list(pair) for pair in case.iut_options]
    if options not in known["option_sets"]:
        known["option_sets"].append(options)
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        part.write_text(json.dumps(known, indent=1) + "\n")
        os.replace(part, path)  # whole: a reader never sees it half written


def read_json(path: Path, what: str = "finding") -> object:
    """A finding's (or a sequence's) JSON value, read bounded, or ValueError naming the file."""
    try:
        with open(path, "rb") as file:
            text = file.read(MOST_FINDING_BYTES + 1)
        if len(text) > MOST_FINDING_BYTES:
            raise ValueError(f"longer than the {MOST_FINDING_BYTES:,} bytes a {what} may be")
        return json.loads(text)
    except RecursionError:  # arrays or objects nested past the parser's depth
        raise ValueError(f"{path}: not a readable JSON {what} (nested too deep)") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON {what} ({e})") from None


def read_finding(path: Path, *models: str) -> dict:
    """A finding of one of `models` written by write_finding, or ValueError naming what is wrong with it."""
    finding = read_json(path)
    if not isinstance(finding, dict) or finding.get("model") not in models or not FIELDS <= set(finding):
        named = " or ".join(f"`kvprobe fuzz --model {model}`" for model in models)
        raise ValueError(f"{path}: expected a finding of {named} with {sorted(FIELDS)}")
    check_finding(finding, finding["model"], str(path))
    return finding
