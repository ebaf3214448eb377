"""Shape matrices (CSV files of `name,shape,probes`) and the cases they make."""

from __future__ import annotations

import csv
import difflib
import io
from dataclasses import dataclass
from pathlib import Path

import kvref
import kvref.serving
from kvref.bounded_reads import read_file
from probes.iut.registry import iut as declared_iut
from probes.suite.cases import PROBE_SECONDS, Case
from probes.suite.registry import DEFAULT_PROBES, PROBES, SHAPE_PROBES, SHARDED_SHAPE_PROBES, Scope

MATRIX_DIR = Path(__file__).with_name("matrices")
COLUMNS = "name,shape[,probes][,sharding]"
MATRIX_FILE_BYTES = 8 * 2**20  # tens of thousands of rows; a file beyond it is refused unread
KNOWN_COLUMNS = ("name", "shape", "probes", "sharding")


@dataclass(frozen=True)
class MatrixRow:
    name: str
    shape: kvref.ShapeKey
    probes: tuple[str, ...] = ("roundtrip",)
    sharding: kvref.Sharding | None = None  # the cache split over a device mesh; None: one device


def serving_rows() -> list[MatrixRow]:
    """The `serving` matrix: each layer cache kvref.serving.SERVING_CONFIGS
    describes, as tpu-inference allocates and shards it."""
    return [MatrixRow(name, cache.key, SHARDED_SHAPE_PROBES, cache.sharding)
            for name, cache in kvref.serving.serving_caches()]


# Matrices made from what kvref knows rather than read from a file.
BUILT_MATRICES = {"serving": serving_rows}
DEFAULT_MATRIX = "default,serving"  # what `kvprobe run` probes unless told otherwise


def matrix_names() -> list[str]:
    return sorted([p.stem for p in MATRIX_DIR.glob("*.csv")] + list(BUILT_MATRICES))


def matrix_path(name_or_path: str) -> Path:
    """A matrix by name (`default`, `seed`, `cpu`) or a CSV file of the same columns."""
    candidate = MATRIX_DIR / f"{name_or_path}.csv"
    path = candidate if candidate.exists() else Path(name_or_path)
    if not path.is_file():
        close = difflib.get_close_matches(name_or_path, matrix_names(), 1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"no shape matrix {name_or_path!r}{hint}: expected one of {matrix_names()}, several "
                         "joined by commas, or a CSV file")
    return path


def load_matrix(names: str) -> list[MatrixRow]:
    """One matrix, or several joined by commas (`default,serving`)."""
    rows: list[MatrixRow] = []
    for name in [n.strip() for n in names.split(",") if n.strip()] or [names]:
        more = BUILT_MATRICES[name]() if name in BUILT_MATRICES else _load_one(name)
        clash = sorted({r.name for r in rows} & {r.name for r in more})
        if clash:
            raise ValueError(f"matrices {names!r} both name row(s) {clash}; each row needs its own name")
        rows += more
    return rows


def _load_one(name_or_path: str) -> list[MatrixRow]:
    path = matrix_path(name_or_path)
    try:
        return _read_matrix(path)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a text CSV file ({e.reason} at byte {e.start}); expected {COLUMNS}") from None
    except csv.Error as e:
        raise ValueError(f"{path}: {e}; expected a CSV file of {COLUMNS}") from None


def _read_matrix(path: Path) -> list[MatrixRow]:
    rows, lines = [], {}
    text = read_file(path, MATRIX_FILE_BYTES, "a matrix file").decode("utf-8")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = {"name", "shape"} - set(reader.fieldnames or ())
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)}; expected {COLUMNS}")
    extra = [c for c in reader.fieldnames if c not in KNOWN_COLUMNS]
    if extra:  # a misspelt column ('probe') would be ignored, and the wrong probes run
        close = difflib.get_close_matches(extra[0], KNOWN_COLUMNS, 1)
        raise ValueError(f"{path}: unknown column {extra[0]!r}" + (f" (did you mean {close[0]!r}?)" if close
                                                                   else "") + f"; expected {COLUMNS}")
    for line, row in enumerate(reader, start=2):
        try:
            shape = kvref.ShapeKey.parse(row["shape"] or "")
        except ValueError as e:
            raise ValueError(f"{path}:{line}: {e}") from None
        probes = tuple((row.get("probes") or "roundtrip").split())
        unknown = sorted(set(probes) - set(SHAPE_PROBES))
        if unknown:
            raise ValueError(f"{path}:{line}: unknown probe(s) {unknown}; expected any of "
                             f"{list(SHAPE_PROBES)}")
        sharding = None
        if (row.get("sharding") or "").strip():
            try:
                sharding = kvref.Sharding.parse(row["sharding"])
                sharding.check(shape.dims)
            except ValueError as e:
                raise ValueError(f"{path}:{line}: {e}") from None
            unsharded = sorted(set(probes) - set(SHARDED_SHAPE_PROBES))
            if unsharded:
                raise ValueError(f"{path}:{line}: probe(s) {unsharded} make caches on one device; a row "
                                 f"with a sharding takes only {list(SHARDED_SHAPE_PROBES)}")
        if row["name"] in lines:  # a case id is the generation, probe and row name
            raise ValueError(f"{path}:{line}: row name {row['name']!r} is also the name of line "
                             f"{lines[row['name']]}; each row needs its own name")
        lines[row["name"]] = line
        rows.append(MatrixRow(row["name"], shape, probes, sharding))
    return rows


def names_a_case_kind(name: str) -> bool:
    """A probe's name, or probe/kind for one kind of a robustness probe."""
    probe, _, kind = name.partition("/")
    return probe in PROBES and (not kind or kind in PROBES[probe].kinds)


# Why a two-process probe is not made for an IUT whose worker holds a real TPU
# on a host of one chip: its producer and consumer would each open it.
ONE_HOLDER = ("its producer and its consumer each hold a chip of their own (TPU_VISIBLE_CHIPS), and this host "
              "has one chip (libtpu lets one process hold a chip); kvprobe does not run a pull between two "
              "hosts yet")
NO_CHIPS_COUNTED = ("its producer and its consumer each hold a chip of their own (TPU_VISIBLE_CHIPS), and no "
                    "TPU runtime of this host was opened to count the chips a process may hold")
# Why a two-process probe's kinds whose caches split over a mesh are not made there.
ONE_CHIP_EACH = "its producer and its consumer each hold one chip of the host, too few devices to split a cache over"


def holds_both_roles(declared, chips: int | None = None) -> bool:
    """Whether a two-process probe's producer and consumer can each hold a
    device of their own: always for an IUT that makes its own arrays; for one
    whose worker owns the TPU, on a host of two chips or more (`chips`: the
    host's, None where unknown, as one)."""
    return not declared.owns_device or (chips or 1) >= 2


def not_applicable(declared, chips: int | None = None) -> tuple[tuple[str, str], ...]:
    """(probe or probe/kind, why) for each probe an IUT never gets: what it
    declares, and the two-process probes where its worker owns the device:
    on a host of one chip, all; on more, their kinds that split a cache."""
    both = holds_both_roles(declared, chips)
    derived = tuple((name, ONE_HOLDER if chips else NO_CHIPS_COUNTED) for name, p in PROBES.items()
                    if p.two_process and not both and declared.applies(name))
    split = tuple((f"{name}/{kind}" if kind else name, ONE_CHIP_EACH) for name, p in PROBES.items()
                  if p.two_process and both and declared.owns_device and declared.applies(name)
                  for kind in p.mesh_kinds)
    dtypes = tuple((f"shape probes on {dtype} caches", why) for dtype, why in declared.unheld_dtypes)
    return (*declared.not_applicable, *derived, *split, *dtypes)


def applies(declared, probe_name: str, chips: int | None = None) -> bool:
    return declared.applies(probe_name) and (not PROBES[probe_name].two_process or holds_both_roles(declared, chips))


def makes(declared, probe_name: str, kind: str = "", chips: int | None = None) -> bool:
    """Whether an IUT gets a probe's case of `kind`: the probe applies to it
    (not_applicable), and its arrays can split a cache where the kind needs
    it (never a two-process probe's worker on a TPU, which holds one chip)."""
    p = PROBES[probe_name]
    split_ok = declared.shards and not (p.two_process and declared.owns_device)
    return (applies(declared, probe_name, chips) and declared.applies(probe_name, kind)
            and (kind not in p.mesh_kinds or split_ok))


def chosen_kinds(probes) -> dict[str, set[str]]:
    """Probe names (or probe/kind for one kind of a robustness probe) as
    {probe: the kinds chosen}, an empty set for every kind."""
    chosen: dict[str, set[str]] = {}
    for entry in probes:
        name, _, kind = entry.partition("/")
        if name in chosen and not chosen[name]:
            continue  # every kind already
        chosen[name] = (chosen.get(name, set()) | {kind}) if kind else set()
    return chosen


def build_cases(generations, matrix: list[MatrixRow], probes=DEFAULT_PROBES, iut="kvref-sim",
                faults: kvref.Faults = kvref.Faults(), timeout=PROBE_SECONDS, devices: int | None = None,
                chips: int | None = None) -> list[Case]:
    """Per generation and per way the IUT's manager is built (its library's
    option sets): each matrix row's shape probes (a row with a sharding only
    for arrays that can split a cache over devices), then each selected
    generation probe once, then each robustness probe once per kind.
    `devices`: how many the IUT's device has (None: as many as asked), so no
    case is made whose caches need more; `chips`: how many chips its host has
    (None: unknown, or the IUT makes its own devices), so a two-process probe
    is made on a TPU only where its producer and consumer each get one."""
    declared = declared_iut(iut)
    unknown = sorted(name for name in dict(declared.not_applicable) if not names_a_case_kind(name))
    if unknown:
        raise ValueError(f"{iut} declares unknown probe(s) {unknown} not applicable; probes are "
                         f"{', '.join(PROBES)}, a kind of one written probe/kind")
    kinds_of = chosen_kinds(probes)
    probes = [p for p in kinds_of if applies(declared, p, chips)]
    cases = []
    for gen in generations:
        for options in declared.library.OPTION_SETS:
            common = dict(faults=faults, timeout=timeout, startup_timeout=declared.startup_seconds,
                          iut_options=tuple(sorted(options.items())))
            for row in matrix:
                if row.sharding and (not declared.shards or (devices is not None and row.sharding.devices > devices)):
                    continue  # arrays that make every cache on one device, or too few devices
                if not declared.holds(row.shape.dtype):
                    continue  # an element type it declares it cannot hold
                cases += [Case(p, gen, iut, row.name, row.shape, sharding=str(row.sharding or ""), **common)
                          for p in row.probes if p in probes]
            for name, p in PROBES.items():
                if name not in probes or p.scope in (Scope.SHAPE, Scope.FUZZ) \
                        or (devices is not None and p.devices > devices):
                    continue
                for kind in p.kinds or ("",):
                    if not makes(declared, name, kind, chips) or (kinds_of[name] and kind not in kinds_of[name]):
                        continue
                    cases.append(Case(name, gen, iut, f"{name}-{kind}" if kind else name, p.subject,
                                      kind=kind, **{**common, "timeout": max(timeout, p.timeout or 0)}))
    return cases
