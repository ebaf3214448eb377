"""The docs: each generated list (probes, fault models, options, TPU chips)
agrees with its one declaration, and every relative link in README.md and
docs/ reaches a file, and the heading it names."""

import dataclasses
import re
import shutil
from pathlib import Path

import pytest

import kvref
from kvref.generations import CHIPS
from probes.run import docs_lists
from probes.run.options import OPTIONS
from probes.suite.registry import PROBES

ROOT = Path(__file__).resolve().parents[2]
PAGES = docs_lists.pages(ROOT)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def generated_blocks(root: Path = ROOT) -> dict[str, list[str]]:
    """Each generated list's name: the pages it sits in."""
    found: dict[str, list[str]] = {}
    for page in docs_lists.pages(root):
        for match in docs_lists.BLOCK.finditer(page.read_text()):
            found.setdefault(match["name"], []).append(page.name)
    return found


def block_rows(name: str) -> list[str]:
    """The first cell of every row of the generated table `name`."""
    for page in PAGES:
        for match in docs_lists.BLOCK.finditer(page.read_text()):
            if match["name"] == name:
                return [line.split("|")[1].strip() for line in match["body"].splitlines()[2:]]
    raise AssertionError(f"no page holds the list {name!r}")


def test_every_generated_list_agrees_with_its_declaration():
    assert docs_lists.stale(ROOT) == [], "run `make docs` (python -m probes.run.docs_lists --write)"


def test_each_list_sits_in_one_page():
    assert generated_blocks() == {"probes": ["probes.md"], "faults": ["kvref.md"], "options": ["commands.md"],
                                  "generations": ["hardware.md"]}


def test_each_list_names_everything_declared_in_declaration_order():
    # The declarations read here directly, not through the renderer.
    assert block_rows("probes") == [f"`{name}`" for name in PROBES]
    assert block_rows("faults") == [f"`{f.name}`" for f in dataclasses.fields(kvref.Faults)]
    assert [row.split(",")[0] for row in block_rows("options")] == [f"`--{name}`" for name in OPTIONS]
    assert block_rows("generations") == [f"`{chip.name}`" for chip in CHIPS]
    assert {"store_fifo_eviction", "store_unchecked_lengths", "parallel_pull_drops_remainder"} <= \
        {row.strip("`") for row in block_rows("faults")}


def copy_of_the_docs(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def test_a_list_out_of_date_is_found_and_rewritten(tmp_path, capsys):
    root = copy_of_the_docs(tmp_path)
    page = root / "docs" / "kvref.md"
    original = page.read_text()
    row = next(line for line in original.splitlines() if line.startswith("| `store_fifo_eviction` |"))
    page.write_text(original.replace(row + "\n", ""))
    assert docs_lists.stale(root) == [page]
    assert docs_lists.main(["--root", str(root)]) == 1
    assert "out of date: docs/kvref.md" in capsys.readouterr().out
    assert docs_lists.main(["--root", str(root), "--write"]) == 0
    assert page.read_text() == original
    assert docs_lists.stale(root) == []


def test_a_block_naming_no_list_is_refused():
    with pytest.raises(ValueError, match="unknown generated list 'chips'; expected one of probes, faults"):
        docs_lists.rewritten("<!-- generated: chips -->\n<!-- end generated -->\n")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def broken_links(pages: list[Path]) -> list[str]:
    broken = []
    for page in pages:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def test_every_relative_link_reaches_a_file_and_its_heading():
    assert broken_links(PAGES) == []


def test_a_broken_link_is_found(tmp_path):
    root = copy_of_the_docs(tmp_path)
    (root / "docs" / "x.md").write_text("# X\n\n[gone](gone.md), [a](probes.md#no-such), [ok](probes.md#verdicts), "
                                        "[web](https://example.com/a.md)\n")
    assert broken_links([root / "docs" / "x.md"]) == ["x.md: gone.md (no such file)",
                                                       "x.md: probes.md#no-such (no such heading)"]
