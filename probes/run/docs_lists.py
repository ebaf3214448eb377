"""The lists in docs/ that are declared once elsewhere, rendered from their
declarations: the probes (`PROBES`), the fault models (`kvref.Faults`), the
options of a run (`OPTIONS`) and the TPU chips (`CHIPS`). Each list sits in
its page between `<!-- generated: NAME -->` and `<!-- end generated -->`.

    python -m probes.run.docs_lists           # the pages whose lists are out of date (exit 1 if any)
    python -m probes.run.docs_lists --write   # rewrite them from their declarations
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable

import kvref
from kvref.generations import CHIPS
from probes.run.options import OPTIONS
from probes.suite.registry import PROBES

ROOT = Path(__file__).resolve().parents[2]  # the repository: README.md and docs/
BLOCK = re.compile(r"(<!-- generated: (?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def cell(text: str) -> str:
    """Text made fit for one cell of a markdown table."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def first_sentence(doc: str) -> str:
    paragraph = " ".join(doc.split("\n\n")[0].split())
    return re.split(r"(?<=[.?!])\s+(?=[A-Z(`])", paragraph)[0]


def probes() -> str:
    rows = [(f"`{p.name}`", p.scope, "yes" if p.default else "no", ", ".join(p.kinds), first_sentence(p.doc))
            for p in PROBES.values()]
    return table(("probe", "scope", "in the default run", "kinds", "what it checks"), rows)


def faults() -> str:
    return table(("fault model", "what it puts back"), [(f"`{name}`", doc) for name, doc in kvref.FAULTS.items()])


def default_text(option) -> str:
    value = option.default
    if option.shown_default:
        return option.shown_default
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) or "none"


def options() -> str:
    rows = [(f"`--{o.name}`" + (f", `{o.short}`" if o.short else ""), f"`--kvprobe-{o.name}`",
             default_text(o), o.help + (f". Unset in the pytest plugin: {o.unset}" if o.unset else ""))
            for o in OPTIONS.values()]
    return table(("option", "pytest plugin", "default", "what it sets"), rows)


def generations() -> str:
    rows = [(f"`{c.name}`", f"`{c.topology}`" if c.topology else "not shipped: compiled live",
             ", ".join(c.device_kinds),
             ", ".join(c.pci_device_ids) + (f" (subsystem {c.pci_subsystem_id})" if c.pci_subsystem_id else ""),
             c.ray_accelerator_type,
             c.torch_tpu_name or "does not run on it", str(c.devices_per_chip)) for c in CHIPS]
    return table(("chip", "shipped layouts", "JAX device kinds", "PCI device ids", "Ray accelerator type",
                  "TorchTPU name", "JAX devices a chip"), rows)


LISTS: dict[str, Callable[[], str]] = {"probes": probes, "faults": faults, "options": options,
                                       "generations": generations}


def rewritten(text: str) -> str:
    """`text` with every generated block rendered afresh; a block naming no
    list is a ValueError naming the known ones."""
    def render(match: re.Match) -> str:
        name = match["name"]
        if name not in LISTS:
            raise ValueError(f"unknown generated list {name!r}; expected one of {', '.join(LISTS)}")
        return match.group(1) + LISTS[name]() + match.group(4)
    return BLOCK.sub(render, text)


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def stale(root: Path = ROOT) -> list[Path]:
    """The pages whose generated lists differ from their declarations."""
    return [page for page in pages(root) if rewritten(page.read_text()) != page.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probes.run.docs_lists", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the pages whose lists are out of date")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    out_of_date = stale(args.root)
    for page in out_of_date:
        if args.write:
            page.write_text(rewritten(page.read_text()))
        print(f"{'rewrote' if args.write else 'out of date'}: {page.relative_to(args.root)}")
    return 1 if out_of_date and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
