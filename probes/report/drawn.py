"""A picture is drawn only when what it shows changed. Each PNG the reports
write carries a fingerprint of what it shows (the values drawn, its title)
and of the code that draws it (these modules' source and matplotlib's
version); a picture whose file already carries the fingerprint it would get
is left as it is. A picture drawn once is kept in a store by its
fingerprint (PICTURES_VARIABLE, else the user's cache folder), and a clone's
committed reports are pictures too: a picture that any of them already
shows is copied, not drawn. Drawing is most of a report's cost, and a run
that earns the verdicts of the last one, or of the committed reports, into
any folder, redraws nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

FINGERPRINT_KEY = "kvprobe-fingerprint"  # the PNG text chunk that holds it
_DRAWING_MODULES = ("drawn.py", "pictures.py", "memory_map.py")
PICTURES_VARIABLE = "KVPROBE_PICTURES"  # the folder of pictures drawn before, by fingerprint
SHIPPED_REPORTS = Path(__file__).resolve().parents[2] / "reports"  # a clone's committed reports


def fingerprint(*shown) -> str:
    """What a picture of `shown` (values with a stable repr) would carry."""
    digest = hashlib.sha256(_drawing_code())
    digest.update(repr(shown).encode())
    return digest.hexdigest()


def up_to_date(path: Path, print_: str) -> bool:
    """Whether `path` is a PNG that already shows what `print_` stands for."""
    # Opening reads the chunks before the image data, where the text is; nothing is decoded.
    return _fingerprint_of(path) == print_


def present(path: Path, print_: str) -> bool:
    """Whether `path` shows what `print_` stands for: it did already, or a
    picture drawn before with that fingerprint was copied there."""
    if up_to_date(path, print_):
        return True
    for source in (store() / f"{print_}.png", _shipped().get(print_)):
        if source is not None and up_to_date(source, print_):
            try:
                shutil.copyfile(source, path)
            except OSError:
                return False  # drawn instead
            return up_to_date(path, print_)
    return False


def save(fig, path: Path, print_: str, dpi: int) -> None:
    """Write the picture, and keep a copy in the store."""
    fig.savefig(path, dpi=dpi, metadata={FINGERPRINT_KEY: print_})
    try:  # a store that cannot be written (a read-only home) only means drawing again next time
        folder = store()
        folder.mkdir(parents=True, exist_ok=True)
        with open(path, "rb") as picture, tempfile.NamedTemporaryFile(dir=folder, suffix=".part",
                                                                      delete=False) as part:
            shutil.copyfileobj(picture, part)
        os.replace(part.name, folder / f"{print_}.png")  # whole, or not there
    except OSError:
        pass


def store() -> Path:
    if os.environ.get(PICTURES_VARIABLE):
        return Path(os.environ[PICTURES_VARIABLE])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "kvprobe" / "pictures"


_SHIPPED: dict[str, Path] | None = None


def _shipped() -> dict[str, Path]:
    """The committed reports' pictures by fingerprint (read once: a header each)."""
    global _SHIPPED
    if _SHIPPED is None:
        _SHIPPED = {}
        for path in sorted(SHIPPED_REPORTS.glob("**/*.png")):
            if print_ := _fingerprint_of(path):
                _SHIPPED.setdefault(print_, path)
    return _SHIPPED


def _fingerprint_of(path: Path) -> str | None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.info.get(FINGERPRINT_KEY)
    except (OSError, UnidentifiedImageError):
        return None


_CODE: bytes | None = None


def _drawing_code() -> bytes:
    global _CODE
    if _CODE is None:
        here = Path(__file__).parent
        _CODE = b"".join((here / name).read_bytes() for name in _DRAWING_MODULES)
        _CODE += metadata.version("matplotlib").encode()
    return _CODE
