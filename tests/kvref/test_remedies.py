"""Remedies for refused shapes: each one the compiler was asked about and
agreed to, the cheapest first; never one it was not asked about. And the
memory map that shows two blocks interleaved, beside the remedy's layout."""

import numpy as np
import pytest

import kvref
from kvref import remedies
from kvref.oracle import compiler
from kvref.oracle.compiler import LayoutRefused
from probes.report import explain, memory_map

REFUSED = ["bf16[512,6144]", "bf16[512,3,2048]", "s8[512,12288]", "bf16[1024,32,576]"]


@pytest.mark.parametrize("generation", ["v5e", "v6e", "tpu7x"])
@pytest.mark.parametrize("text", REFUSED)
def test_the_shipped_remedy_is_what_the_compiler_gives_and_its_blocks_are_byte_ranges(text, generation):
    key = kvref.ShapeKey.parse(text)
    original = kvref.tpu_layout(key.dtype, key.dims, generation)
    assert not kvref.major_slice(original).addressable
    best = remedies.cheapest(key, generation, original)
    assert best is not None and kvref.major_slice(best.shape).addressable
    # Asked again, live: the change as described gives exactly this layout.
    candidate = next(c for c in remedies._candidates(key) if c[0] == best.change)
    live = compiler.compile_layout(key.dtype, candidate[2], generation, requested=candidate[3])
    assert live.shape == best.shape and live.output_bytes == best.physical_bytes
    assert best.cost == pytest.approx(best.physical_bytes / original.physical_size_bytes)


def test_the_cheapest_comes_first_and_every_one_listed_is_addressable():
    key = kvref.ShapeKey.parse("bf16[512,3,2048]")
    original = kvref.tpu_layout(key.dtype, key.dims, "v6e")
    found = remedies.remedies(key, "v6e", original)
    assert len(found) > 1 and all(kvref.major_slice(r.shape).addressable for r in found)
    assert [r.cost for r in found] == sorted(r.cost for r in found)


def test_no_remedy_is_shown_that_the_compiler_did_not_agree_to(monkeypatch):
    def refuse(*args, **kwargs):
        raise LayoutRefused("refused")

    monkeypatch.setattr(remedies, "lookup", refuse)
    monkeypatch.setattr(remedies.table, "remedy", lambda generation, key: None)  # nothing shipped
    e = explain.explain("bf16[512,6144]", "v6e")
    assert e.remedy is None and "none of the changes tried" in explain.render(e)


def test_without_a_compiler_the_remedy_says_it_was_not_checked(monkeypatch):
    def unavailable(*args, **kwargs):
        raise kvref.OracleUnavailable("the live TPU compiler needs libtpu")

    monkeypatch.setattr(remedies, "lookup", unavailable)
    monkeypatch.setattr(remedies.table, "remedy", lambda generation, key: None)
    assert "remedy          not checked: the live TPU compiler needs libtpu" in explain.render(
        explain.explain("bf16[512,6144]", "v6e"))


def test_explain_gives_the_remedy_with_its_memory_cost():
    text = explain.render(explain.explain("bf16[512,3,2048]", "v6e"))
    assert "NOT addressable" in text and "remedy " in text and "x the memory" in text


def runs(codes: np.ndarray, code: int) -> int:
    """How many separate runs of `code` the flattened grid has."""
    flat = (codes.reshape(-1) == code).astype(int)
    return int(((flat[1:] == 1) & (flat[:-1] == 0)).sum() + flat[0])


def test_the_map_shows_interleaved_blocks_as_stripes_and_a_remedy_as_two_runs():
    tiled = kvref.Shape.parse("bf16[64,1024]{1,0:T(8,128)(2,1)}")  # 8 rows share every tile
    grid, step = memory_map.block_grid(tiled, (0, 1), width=64, lines=64)
    # Blocks 0 and 1 share 32-bit words ((2,1) sub-tiles) in each of the 8 tiles a row spans.
    assert step == 16 and runs(grid, memory_map.BOTH) == 8 and not (grid == memory_map.FIRST).any()
    flat = kvref.Shape.parse("bf16[64,8,128]{2,1,0:T(8,128)(2,1)}")
    grid, _ = memory_map.block_grid(flat, (0, 1), width=64, lines=64)
    assert runs(grid, memory_map.FIRST) == 1 and runs(grid, memory_map.SECOND) == 1
    assert not (grid == memory_map.BOTH).any()


def test_the_map_draws_the_remedy_beside_the_layout(tmp_path):
    path = tmp_path / "map.png"
    memory_map.draw(kvref.Shape.parse("bf16[64,1024]{1,0:T(8,128)(2,1)}"), path,
                    remedy=("remedy: split", kvref.Shape.parse("bf16[64,8,128]{2,1,0:T(8,128)(2,1)}")))
    from PIL import Image

    assert Image.open(path).size[0] > Image.open(path).size[1]  # two panels side by side
    with pytest.raises(ValueError, match=r"blocks \(0, 99\) are not both among the 64 blocks"):
        memory_map.draw(kvref.Shape.parse("bf16[64,1024]{1,0:T(8,128)(2,1)}"), path, blocks=(0, 99))
