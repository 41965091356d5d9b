"""Training metrics as JSON lines, consistent across a kill and resume.

One record per line, ``{"step": s, ...}``, where s counts finished optimiser steps. A resumed run
starts from its checkpoint's step c: on opening, records with step > c (written after the last
checkpoint by the run that died) are dropped, and so is a torn last line, by rewriting the kept
records to a temp file and renaming it. The file then reads as one uninterrupted run.
"""

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def read(path: str | Path) -> list[dict[str, Any]]:
  """Every complete record of a metrics file (a torn last line is skipped)."""
  records = []
  path = Path(path)
  if not path.is_file():
    return records
  for line in path.read_text().splitlines():
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return records


class MetricsLog:
  """Appends records to ``path``; keeps only those at or before ``resume_step`` from earlier."""

  def __init__(self, path: str | Path, resume_step: int = 0):
    self.path = Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    kept = [r for r in read(self.path) if r.get("step", 0) <= resume_step]
    fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, self.path)
    self._file = self.path.open("a")

  def write(self, record: dict[str, Any]) -> None:
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()

  def close(self) -> None:
    self._file.close()
