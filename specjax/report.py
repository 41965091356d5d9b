"""Regenerates an experiment README's results block from its JSON: tables are never typed by hand.

    python -m specjax.report experiments/attention_window [experiments/feature_cost ...]

An experiment's ``report.py`` (beside its ``config.py``, which holds no report code) defines
``report(results_dir) -> str`` (Markdown built from the JSON under ``results/``, figures drawn
there too); this writes it between the ``<!-- results -->`` and ``<!-- /results -->`` lines of
the experiment's ``README.md``. Where the module also defines ``details(results_dir) -> str``
(the full tables, kept out of a README that shows the headline ones), that goes between the same
lines of the ``notes.md`` beside it. Each file is written atomically and the rest of it is kept;
both are checked, and both blocks rendered, before either is written.
"""

import importlib.util
import json
import os
import re
import sys
import tempfile
from pathlib import Path

BEGIN, END = "<!-- results -->", "<!-- /results -->"


def render(experiment: str | Path) -> list[Path]:
  """Fills the experiment's README.md (and notes.md, where its report module has ``details``);
  returns the files written."""
  folder = Path(experiment)
  if not folder.exists():
    raise ValueError(f"{folder} does not exist: pass an experiment folder (experiments/NAME).")
  if not folder.is_dir():
    raise ValueError(f"{folder} is a file: pass its experiment folder (experiments/NAME).")
  module = load_module(folder)
  blocks = {folder / "README.md": module.report}
  if hasattr(module, "details"):
    blocks[folder / "notes.md"] = module.details
  texts = {path: _text(path) for path in blocks}  # every target checked before any is filled
  rendered = _rendered(folder, blocks)
  for path, markdown in rendered.items():
    if not markdown.strip() and _block(texts[path]):
      raise ValueError(
        f"{folder / 'results'} holds nothing to report, and {path} has results: run the "
        f"experiment first ({folder / 'config.py'}); {path.name} is left as it is."
      )
  texts = {path: _filled(text, rendered[path]) for path, text in texts.items()}
  for path, text in texts.items():
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.stem}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  return list(texts)


def _rendered(folder: Path, blocks: dict) -> dict:
  """Each file's block as its report renders it from ``folder/results``; a results file the
  report reads and does not find, that is not JSON, or that lacks what the report reads, is one
  error naming it (``$SPECJAX_TRACEBACK`` set: the traceback of the last)."""
  rerun = f"run the experiment again ({folder / 'config.py'}); nothing was written"
  for path in sorted((folder / "results").rglob("*.json")):
    try:
      json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"{path} is not valid JSON ({e}): {rerun}.") from None
  try:
    return {path: fn(folder / "results") for path, fn in blocks.items()}
  except FileNotFoundError as e:
    raise ValueError(
      f"{e.filename} is missing: run the experiment first ({folder / 'config.py'}); "
      "nothing was written."
    ) from None
  except (KeyError, IndexError, TypeError) as e:
    if os.environ.get("SPECJAX_TRACEBACK"):
      raise
    raise ValueError(
      f"{folder / 'report.py'} could not read {folder / 'results'}: {type(e).__name__} {e} "
      f"(a results file lacks what the report reads: a run not finished, or of another config?): "
      f"{rerun}."
    ) from None


def _block(text: str) -> str:
  """What ``text``'s results block holds (stripped)."""
  got = re.search(re.escape(BEGIN) + r"(.*?)" + re.escape(END), text, re.S)
  return got[1].strip() if got else ""


def _text(path: Path) -> str:
  """The file's text, which must have a results block to fill."""
  if not path.is_file():
    why = ": its report defines details(results_dir)" if path.name == "notes.md" else ""
    raise ValueError(f"{path.parent} has no {path.name} to fill{why}.")
  text = path.read_text()
  if BEGIN not in text or END not in text:
    raise ValueError(f"{path} has no {BEGIN} ... {END} block to fill.")
  return text


def _filled(text: str, markdown: str) -> str:
  """``text`` with its results block holding ``markdown`` (as it is: no escapes read)."""
  block = "\n".join(filter(None, (BEGIN, markdown.strip(), END)))
  return re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)


def load_module(folder: Path):
  """The experiment's report module, its ``report.py``: it defines ``report`` (and may define
  ``details``)."""
  path = folder / "report.py"
  if not path.is_file():
    raise ValueError(
      f"{folder} has no report.py: pass an experiment folder with results (experiments/NAME)."
    )
  spec = importlib.util.spec_from_file_location(f"_experiment_{folder.name}_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "report"):
    raise ValueError(f"{path} defines no report(results_dir): nothing to render.")
  return module


def load(folder: Path):
  """The experiment's ``report`` function, from its ``report.py``."""
  return load_module(folder).report


def main(argv: list[str]) -> None:
  if not argv:
    sys.exit("usage: python -m specjax.report experiments/NAME [experiments/NAME ...]")
  for folder in argv:
    try:
      for path in render(folder):
        print(f"wrote {path}")
    except ValueError as e:  # bad input: one line, as python -m specjax.run gives it
      sys.exit(f"error: {e}")


if __name__ == "__main__":
  main(sys.argv[1:])
