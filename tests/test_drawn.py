"""Report pictures are drawn only when what they show changed: a picture
whose PNG carries the fingerprint it would get is left alone; any change in
what it shows, a PNG without a fingerprint, or a damaged one is drawn anew."""

from pathlib import Path

import pandas as pd
import pytest

import kvref
from probes.report import drawn, memory_map
from probes.report.pictures import draw_heatmap

REPO = Path(__file__).resolve().parents[1]
SHAPE = kvref.Shape.parse("bf16[64,1024]{1,0:T(8,128)(2,1)}")


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
    assert saves == [plain, damaged]
    assert drawn.up_to_date(plain, drawn.fingerprint(str(SHAPE), "", None, (0, 1), 256, 128))


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
