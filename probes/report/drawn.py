"""A picture is drawn only when what it shows changed. Each PNG the reports
write carries a fingerprint of what it shows (the values drawn, its title)
and of the code that draws it (these modules' source and matplotlib's
version); a picture whose file already carries the fingerprint it would get
is left as it is. Drawing is most of a report's cost, and a run that earns
the verdicts of the last one, or a clone whose committed reports hold them,
redraws nothing."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

FINGERPRINT_KEY = "kvprobe-fingerprint"  # the PNG text chunk that holds it
_DRAWING_MODULES = ("drawn.py", "pictures.py", "memory_map.py")


def fingerprint(*shown) -> str:
    """What a picture of `shown` (values with a stable repr) would carry."""
    digest = hashlib.sha256(_drawing_code())
    digest.update(repr(shown).encode())
    return digest.hexdigest()


def up_to_date(path: Path, print_: str) -> bool:
    """Whether `path` is a PNG that already shows what `print_` stands for."""
    from PIL import Image, UnidentifiedImageError

    try:  # opening reads the chunks before the image data, where the text is; nothing is decoded
        with Image.open(path) as image:
            return image.info.get(FINGERPRINT_KEY) == print_
    except (OSError, UnidentifiedImageError):
        return False


def save(fig, path: Path, print_: str, dpi: int) -> None:
    fig.savefig(path, dpi=dpi, metadata={FINGERPRINT_KEY: print_})


_CODE: bytes | None = None


def _drawing_code() -> bytes:
    global _CODE
    if _CODE is None:
        here = Path(__file__).parent
        _CODE = b"".join((here / name).read_bytes() for name in _DRAWING_MODULES)
        _CODE += metadata.version("matplotlib").encode()
    return _CODE
