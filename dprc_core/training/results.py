"""The results CSV of a job, one row per step: ``step,train_loss,valid_loss,epsilon,
clipped_fraction,batch_size,dropped`` (OpenAI's fine-tuning results file, with ε).

``epsilon`` is an upper bound on ε spent up to that step (exact at checkpoints and at the
end); ``valid_loss`` is filled at checkpoint steps of a job with a validation file; an empty
cell is a value that was not computed or not reported (``train_loss`` and
``clipped_fraction`` are empty when the job says ``report_train_loss: false``). Numbers are
written with Python's shortest round-trip ``repr``, so a cell reads back as the exact float.

``dprc train`` writes ``results.csv`` in its output folder as the steps run (a resumed run
first drops the rows after the checkpoint it resumes from, then replays them); the service
writes the same columns from the job's metrics events when the job ends.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

RESULT_COLUMNS = (
    "step",
    "train_loss",
    "valid_loss",
    "epsilon",
    "clipped_fraction",
    "batch_size",
    "dropped",
)
RESULTS_NAME = "results.csv"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        raise ValueError(f"not a number: {value!r}")
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def csv_line(row: Mapping[str, Any]) -> str:
    """One CSV line of ``row`` (keys outside :data:`RESULT_COLUMNS` are an error)."""
    unknown = set(row) - set(RESULT_COLUMNS)
    if unknown:
        raise ValueError(f"unknown result columns: {sorted(unknown)}")
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(row.get(c)) for c in RESULT_COLUMNS])
    return buf.getvalue()


def header() -> str:
    return ",".join(RESULT_COLUMNS) + "\n"


def results_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    """The whole CSV (header and ``rows``, in order)."""
    return header() + "".join(csv_line(r) for r in rows)


def read_results(text: str) -> list[dict[str, float | int | None]]:
    """Rows of a results CSV with numbers parsed (empty cells: None)."""
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != RESULT_COLUMNS:
        raise ValueError(f"not a results CSV: columns {reader.fieldnames}")
    out: list[dict[str, float | int | None]] = []
    for rec in reader:
        out.append(
            {
                c: None
                if rec[c] == ""
                else (int(rec[c]) if c in ("step", "batch_size", "dropped") else float(rec[c]))
                for c in RESULT_COLUMNS
            }
        )
    return out


class ResultsFile:
    """``results.csv`` of a library run, appended as steps run. Opening it for a run that
    resumes after ``resumed_from`` steps keeps the rows up to that step only (later rows were
    never checkpointed; the run replays them)."""

    def __init__(self, folder: Path, resumed_from: int):
        self.path = folder / RESULTS_NAME
        kept: list[dict[str, Any]] = []
        if resumed_from and self.path.is_file():
            rows = read_results(self.path.read_text())
            kept = [r for r in rows if r["step"] is not None and int(r["step"]) <= resumed_from]
        self.path.write_text(results_csv(kept))

    def append(self, row: Mapping[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(csv_line(row))
