"""Training metrics as JSON lines, consistent across a kill and resume.

One record per line, ``{"step": s, ...}``, where s counts finished optimiser steps. A resumed run
starts from its checkpoint's step c: on opening, records with step > c (written after the last
checkpoint by the run that died) are dropped, and so is a torn last line, by rewriting the kept
records to a temp file and renaming it. The file then reads as one uninterrupted run.

Beside it, ``tensorboard_dir`` (if given) receives the same scalars as TensorBoard event files
(tensorboardX; no TensorFlow): a field named ``group/name`` (``eval/loss``) under its own tag,
any other under ``train/<name>``, at each record's step, so ``tensorboard --logdir WORKDIR``
shows the curves. A resumed run writes a purge marker at its first new step: TensorBoard then
drops the dead run's events from that step on, as the JSONL drops its records. The JSONL stays
the record of the run.
"""

import json
import numbers
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import tensorboardX


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


def scalar_tag(name: str) -> str:
  """A record field's TensorBoard tag: ``eval/loss`` as it is, ``loss`` as ``train/loss``."""
  return name if "/" in name else f"train/{name}"


class MetricsLog:
  """Appends records to ``path`` (and their scalars to ``tensorboard_dir``); keeps only those at
  or before ``resume_step`` from earlier."""

  def __init__(self, path: str | Path, resume_step: int = 0, tensorboard_dir=None):
    self.path = Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    kept = [r for r in read(self.path) if r.get("step", 0) <= resume_step]
    fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, self.path)
    self._file = self.path.open("a")
    self._events = None
    if tensorboard_dir is not None:
      purge = resume_step + 1 if resume_step else None
      # tensorboardX names a file by the second and the host: a run resumed within the same
      # second would replace the earlier run's file without a suffix of its own.
      self._events = tensorboardX.SummaryWriter(
        str(tensorboard_dir), purge_step=purge, filename_suffix=f".{uuid.uuid4().hex[:8]}"
      )

  def write(self, record: dict[str, Any]) -> None:
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    if self._events is not None:
      step = int(record.get("step", 0))
      for name, value in record.items():
        if name != "step" and isinstance(value, numbers.Real) and not isinstance(value, bool):
          self._events.add_scalar(scalar_tag(name), float(value), step)
      self._events.flush()

  def close(self) -> None:
    self._file.close()
    if self._events is not None:
      self._events.close()
