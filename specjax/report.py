"""Regenerates an experiment README's results block from its JSON: tables are never typed by hand.

    python -m specjax.report experiments/attention_window [experiments/feature_cost ...]

An experiment's ``report.py`` (or, in the older experiments, its ``config.py``) defines
``report(results_dir) -> str`` (Markdown built from the JSON under ``results/``, figures drawn
there too); this writes it between the ``<!-- results -->`` and ``<!-- /results -->`` lines of
the experiment's ``README.md`` (atomically; the rest of the README is kept).
"""

import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

BEGIN, END = "<!-- results -->", "<!-- /results -->"


def render(experiment: str | Path) -> Path:
  folder = Path(experiment)
  if not folder.exists():
    raise ValueError(f"{folder} does not exist: pass an experiment folder (experiments/NAME).")
  if not folder.is_dir():
    raise ValueError(f"{folder} is a file: pass its experiment folder (experiments/NAME).")
  report = load(folder)
  readme = folder / "README.md"
  if not readme.is_file():
    raise ValueError(f"{folder} has no README.md to fill.")
  text = readme.read_text()
  if BEGIN not in text or END not in text:
    raise ValueError(f"{readme} has no {BEGIN} ... {END} block to fill.")
  block = f"{BEGIN}\n{report(folder / 'results').strip()}\n{END}"
  text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".README.", suffix=".tmp")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.chmod(tmp, 0o644)
  os.replace(tmp, readme)
  return readme


def load(folder: Path):
  """The experiment's ``report`` function: from its ``report.py``, else its ``config.py``."""
  path = next((folder / f for f in ("report.py", "config.py") if (folder / f).is_file()), None)
  if path is None:
    raise ValueError(f"{folder} has no config.py: pass an experiment folder (experiments/NAME).")
  spec = importlib.util.spec_from_file_location(f"_experiment_{folder.name}_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "report"):
    raise ValueError(f"{path} defines no report(results_dir): nothing to render.")
  return module.report


def main(argv: list[str]) -> None:
  if not argv:
    sys.exit("usage: python -m specjax.report experiments/NAME [experiments/NAME ...]")
  for folder in argv:
    try:
      print(f"wrote {render(folder)}")
    except ValueError as e:  # bad input: one line, as python -m specjax.run gives it
      sys.exit(f"error: {e}")


if __name__ == "__main__":
  main(sys.argv[1:])
