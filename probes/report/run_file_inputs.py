"""The fuzz category `run_files` (make fuzz), the report room's own: a run
CSV as a user may hold it after a hand edit, a torn copy or a spreadsheet's
save (cut at any byte, a column dropped, a cell replaced, bytes that are no
text). `kvprobe report` and
`diff` read each through read_run: a run, or one ValueError naming the file;
never another exception."""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path

from probes.fuzz.mismatch import Mismatch
from probes.report.results import COLUMNS, read_run

JUNK = ("", "abc", "nan", "1e999", "-1", "\"", "\x00", "é", "PASS,PASS", "\n", "9" * 40)


def _valid_rows(rng) -> list[list[str]]:
    rows = [list(COLUMNS)]
    for i in range(int(rng.integers(0, 4))):
        row = {c: "" for c in COLUMNS} | {"generation": "v5e", "iut": "kvref-sim", "probe": "roundtrip",
                                          "case_id": f"v5e/roundtrip/{i}", "verdict": "PASS", "seconds": "1.5"}
        rows.append([row[c] for c in COLUMNS])
    return rows


class RunFiles:
    name = "run_files"

    def generate(self, rng) -> dict:
        rows = _valid_rows(rng)
        how = str(rng.choice(["cut", "drop_column", "cell", "bytes", "whole"]))
        if how == "drop_column":
            gone = int(rng.integers(len(COLUMNS)))
            rows = [r[:gone] + r[gone + 1:] for r in rows]
        elif how == "cell" and len(rows) > 1:
            r, c = int(rng.integers(1, len(rows))), int(rng.integers(len(COLUMNS)))
            rows[r][c] = str(rng.choice(JUNK))
        out = io.StringIO()
        csv.writer(out).writerows(rows)
        data = out.getvalue().encode()
        if how == "cut":
            data = data[: int(rng.integers(0, len(data) + 1))]
        elif how == "bytes":
            data = bytes(int(b) for b in rng.integers(0, 256, int(rng.integers(0, 200))))
        return {"how": how, "data": data.hex()}

    def run(self, case: dict) -> str:
        with tempfile.TemporaryDirectory(prefix="kvprobe-runfile-") as folder:
            path = Path(folder) / "run.csv"
            path.write_bytes(bytes.fromhex(case["data"]))
            try:
                read_run(path)
            except ValueError as e:
                if str(path) not in str(e) or "\n" in str(e):
                    raise Mismatch(f"{case['how']}: refused, but not in one line naming the file: {e!r}") from None
                return "refused"
            except Exception as e:  # noqa: BLE001 - what this category looks for
                raise Mismatch(f"{case['how']}: {type(e).__name__} from read_run: {e}") from None
        return "accepted"
