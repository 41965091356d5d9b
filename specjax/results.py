"""Writing results: JSON records and figures (atomically) and plain-text tables."""

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_json(path: str | Path, record: Any) -> Path:
  """Writes ``record`` to ``path`` via a temp file and rename: never a half-written file."""
  return write_text(path, json.dumps(record, indent=2, sort_keys=False) + "\n")


def write_text(path: str | Path, text: str) -> Path:
  """Writes ``text`` to ``path`` via a temp file and rename: never a half-written file."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes it owner-only
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise
  return path


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
  """Saves a matplotlib figure (laid out tight) via a temp file and rename, then closes it."""
  import matplotlib.pyplot as plt

  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
  fig.savefig(tmp, dpi=dpi)
  plt.close(fig)
  os.replace(tmp, path)
  return path


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
  """A fixed-width text table; floats get 3 significant decimals."""
  fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)
  cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths, strict=True))
  return "\n".join([line(columns), line(["-" * w for w in widths]), *map(line, cells)])


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
  """The same table in Markdown (for READMEs generated from results JSON)."""
  fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
  return "\n".join(lines)


def section(title: str, intro: str, rows: Sequence[dict[str, Any]], columns=None) -> list[str]:
  """A README section as lines: ``## title``, an intro paragraph and the rows' Markdown table
  (``columns``: by default the first row's keys); no lines when there are no rows."""
  if not rows:
    return []
  table_ = markdown_table(rows, tuple(columns or rows[0]))
  return [f"## {title}", "", intro, "", table_, ""]


def check_path_text(
  path, field: str, what: str = "the directory to write to (e.g. results/NAME)"
) -> None:
  """A path as typed: empty, starting with ~ (which the shell expands only at a word's start,
  not after ``--flag=``) or with a space at either end (a quoting slip) is one error naming
  ``field``, before anything is made there."""
  text = str(path)
  if not text.strip():
    raise ValueError(f"{field} is empty: name {what}.")
  if text.startswith("~"):
    raise ValueError(
      f"{field}={text!r} starts with ~, which the shell leaves as it is after '=': give the "
      f"full path (e.g. {field}=$HOME{text[1:]})."
    )
  if text != text.strip():
    raise ValueError(
      f"{field}={text!r} starts or ends with a space, which would be part of the name: "
      f"remove it ({field}={text.strip()!r})."
    )


def check_writable(directory, field: str) -> None:
  """Raises a ValueError naming ``field`` unless ``directory`` is (or can be made) a writable
  directory: checked before a run starts, so its results are never lost at the end."""
  check_path_text(directory, field)
  path = Path(directory)
  if path.exists() and not path.is_dir():
    raise ValueError(f"{field}={str(directory)!r} is a file, not a directory: choose another path.")
  try:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
      pass
  except OSError as e:
    raise ValueError(
      f"{field}={str(directory)!r} is not writable ({e.strerror}): choose a directory you can "
      "write to."
    ) from None
