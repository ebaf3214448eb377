"""Report pictures are drawn only when what they show changed: a picture
whose PNG carries the fingerprint it would get is left alone; any change in
what it shows, a PNG without a fingerprint, or a damaged one is drawn anew."""

from pathlib import Path

import pandas as pd
import pytest

import kvref
from probes.report import drawn, memory_map
from probes.report.pictures import draw_heatmap

REPO = Path(__file__).resolve().parents[2]
SHAPE = kvref.Shape.parse("bf16[64,1024]{1,0:T(8,128)(2,1)}")


@pytest.fixture(autouse=True)
def stores(tmp_path, monkeypatch):
    """A store of this test's own and no committed reports, unless a test plants them."""
    monkeypatch.setenv(drawn.PICTURES_VARIABLE, str(tmp_path / "store"))
    monkeypatch.setattr(drawn, "SHIPPED_REPORTS", tmp_path / "shipped")
    monkeypatch.setattr(drawn, "_SHIPPED", None)


@pytest.fixture
def saves(monkeypatch):
    """Every picture actually written, by path."""
    written = []
    real = drawn.save

    def counting(fig, path, print_, dpi):
        written.append(Path(path))
        real(fig, path, print_, dpi)

    monkeypatch.setattr(drawn, "save", counting)
    return written


def test_a_memory_map_is_drawn_once_for_what_it_shows(tmp_path, saves):
    path = tmp_path / "map.png"
    memory_map.draw(SHAPE, path, title="interleaved")
    memory_map.draw(SHAPE, path, title="interleaved")
    assert saves == [path]
    memory_map.draw(SHAPE, path, title="another title")
    memory_map.draw(SHAPE, path, title="another title", blocks=(0, 2))
    assert saves == [path] * 3


def test_a_picture_without_a_fingerprint_or_damaged_is_drawn_again(tmp_path, saves):
    plain = tmp_path / "plain.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.savefig(plain)  # a PNG, but no fingerprint
    plt.close(fig)
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    for path in (plain, damaged):
        memory_map.draw(SHAPE, path)
    assert saves == [plain]  # then copied over the damaged one from the store
    for path in (plain, damaged):
        assert drawn.up_to_date(path, drawn.fingerprint(str(SHAPE), "", None, (0, 1), 256, 128))


def test_bad_input_is_refused_even_when_the_picture_is_up_to_date(tmp_path):
    path = tmp_path / "map.png"
    memory_map.draw(SHAPE, path)
    with pytest.raises(ValueError, match="blocks"):
        memory_map.draw(SHAPE, path, blocks=(0, 99))


def test_the_heatmap_is_drawn_again_when_a_verdict_changes(tmp_path, saves):
    frame = pd.read_csv(REPO / "reports" / "v5e" / "baseline.csv", keep_default_na=False)
    path = tmp_path / "verdicts.png"
    draw_heatmap(frame, path, "v5e")
    draw_heatmap(frame, path, "v5e")
    assert saves == [path]
    changed = frame.copy()
    changed.loc[changed.index[0], "verdict"] = "CORRUPT" if changed["verdict"].iloc[0] != "CORRUPT" else "PASS"
    draw_heatmap(changed, path, "v5e")
    assert saves == [path, path]


def test_the_fingerprint_covers_the_drawing_code():
    # A change in how pictures are drawn redraws them, though the data is the same.
    before = drawn.fingerprint("same")
    drawn._CODE = drawn._drawing_code() + b"# another line"
    try:
        assert drawn.fingerprint("same") != before
    finally:
        drawn._CODE = None


def test_a_picture_drawn_once_is_copied_into_another_folder(tmp_path, saves):
    first, second = tmp_path / "a.png", tmp_path / "b" / "map.png"
    second.parent.mkdir()
    memory_map.draw(SHAPE, first, title="interleaved")
    memory_map.draw(SHAPE, second, title="interleaved")
    assert saves == [first] and second.read_bytes() == first.read_bytes()
    memory_map.draw(SHAPE, second, title="another title")  # not drawn before: drawn
    assert saves == [first, second]


def test_a_committed_picture_is_copied_not_drawn(tmp_path, saves):
    shipped = tmp_path / "shipped" / "v5e"
    shipped.mkdir(parents=True)
    memory_map.draw(SHAPE, shipped / "memory-map.png", title="interleaved")
    (tmp_path / "store" / f"{drawn.fingerprint(str(SHAPE), 'interleaved', None, (0, 1), 256, 128)}.png").unlink()
    drawn._SHIPPED = None  # the committed reports are read once per process: as a new one would
    path = tmp_path / "new.png"
    memory_map.draw(SHAPE, path, title="interleaved")
    assert saves == [shipped / "memory-map.png"] and path.read_bytes() == (shipped / "memory-map.png").read_bytes()


def test_a_damaged_picture_in_the_store_is_drawn_again(tmp_path, saves):
    print_ = drawn.fingerprint(str(SHAPE), "interleaved", None, (0, 1), 256, 128)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / f"{print_}.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    path = tmp_path / "map.png"
    memory_map.draw(SHAPE, path, title="interleaved")
    assert saves == [path] and drawn.up_to_date(path, print_)
    assert drawn.up_to_date(tmp_path / "store" / f"{print_}.png", print_)  # the store mended


def test_the_heatmap_of_a_generations_run_fits_a_screen(tmp_path):
    """A run's many shapes go across, the other probes beside them: wide, not a strip 2,500 px tall."""
    import matplotlib.image as mpimg

    from probes.report import results

    path = tmp_path / "verdicts.png"
    draw_heatmap(results.read_run(REPO / "reports" / "v5e" / "baseline.csv"), path, "v5e")
    height, width = mpimg.imread(path).shape[:2]
    assert height <= 1200 and width <= 2400 and width > height, (width, height)
