"""`kvprobe explain`: layout, sizes, verdict, host pools and the memory map."""

import numpy as np
import pytest

import kvref
from probes.suite.ownership import PADDING, physical_owners
from probes.run import cli


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_seed_shape_shows_whole_buffer_as_legacy_slice(capsys):
    code, out, _ = run(capsys, "explain", "bf16[512,3,2048]", "-g", "tpu7x",
                       "--host-blocks", "1000", "--layers", "20")
    assert code == 0
    assert "bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}" in out and "table: jax" in out
    assert "NOT addressable" in out and "not the outermost physical dim" in out
    assert "legacy formula: 6,291,456 B" in out
    # 1000 blocks x 20 layers x the 6 MiB "slice": host memory nobody has.
    assert f"legacy {1000 * 20 * 6 * 2**20:,} B" in out
    assert "fixed refused at construction" in out


def test_addressable_shape_shows_equal_pools(capsys):
    code, out, _ = run(capsys, "explain", "bf16[512,16,2048]{2,1,0:T(8,128)(2,1)}", "--layers", "2")
    assert code == 0 and "addressable: 65,536 B" in out
    pool = f"{512 * 65536 * 2:,} B"
    assert f"fixed {pool}" in out and f"legacy {pool}" in out


def test_several_generations(capsys):
    code, out, _ = run(capsys, "explain", "s8[512,12288]", "-g", "v3,v4")
    assert code == 0
    assert "s8[512,12288]{1,0:T(8,128)(4,1)}" in out and "s8[512,12288]{1,0:T(32,128)(4,1)}" in out
    assert "smallest contiguous group: 8 rows" in out and "smallest contiguous group: 32 rows" in out


@pytest.mark.parametrize("argv, needle", [
    (["explain", "bf16[512,3,2048]", "-g", "V9"], "unknown TPU generation 'V9'"),
    (["explain", "bf16[512,3,2048]", "--layers", "0"], "expected a positive number"),
])
def test_bad_arguments_exit_2(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("text, needle", [
    ("bf16[512,3", "expected a shape such as"),
    ("bf17[4]{0}", "unknown element type 'bf17'"),
    # XLA's dims and element counts are int64: beyond, the compiler fails deep inside (a traceback).
    ("bf16[" + "9" * 401 + ",8,128]", "does not fit in int64"),
    ("bf16[9223372036854775808,8,128]", "does not fit in int64"),
    ("bf16[9223372036854775807,8,128]", "element count overflows int64"),
])
def test_bad_shapes_are_reported(capsys, text, needle):
    code, _, err = run(capsys, "explain", text, "-g", "v5e")
    assert code == 2 and needle in err and len(err) < 1000, err


def test_png_needs_a_pattern_for_several(capsys, tmp_path):
    code, _, err = run(capsys, "explain", "bf16[512,6144]", "-g", "all", "--png", str(tmp_path / "m.png"))
    assert code == 2 and "{generation}" in err and not list(tmp_path.iterdir())


def test_png_is_written(capsys, tmp_path):
    path = tmp_path / "map.png"
    code, out, _ = run(capsys, "explain", "bf16[64,256]{1,0:T(8,128)(2,1)}", "--png", str(path))
    assert code == 0 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_map_owners_follow_the_layout():
    shape = kvref.Shape.parse("bf16[16,128]{1,0:T(8,128)(2,1)}")
    owners = physical_owners(shape)
    # One 32-bit word holds rows 0 and 1 of a column; the next tile holds rows 8..15.
    assert list(owners[:4]) == [0, 1, 0, 1]
    assert owners[1024] == 8 and set(owners[:1024]) == set(range(8))
    padded = physical_owners(kvref.Shape.parse("f32[3,5]{1,0:T(8,128)}"))
    assert (padded == PADDING).sum() == 8 * 128 - 15
    assert np.array_equal(padded[:5], [0] * 5)
