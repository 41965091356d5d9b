"""Every experiment README's results block (and its notes.md block, where the report defines
``details``) is what its report renders from the committed JSON: no number in the docs is typed
by hand or left stale."""

import re
import shutil
from pathlib import Path

import pytest

from specjax import report

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(
  p.parent.name
  for p in ROOT.glob("experiments/*/README.md")
  if report.BEGIN in p.read_text() and (p.parent / "results").is_dir()
)


def _block(path: Path) -> str | None:
  block = re.escape(report.BEGIN) + r"(.*?)" + re.escape(report.END)
  got = re.search(block, path.read_text(), re.S)
  return None if got is None else got[1].strip()


def test_there_are_experiments_to_check():
  assert {"losslessness", "speculative_theory", "eagle_smollm2"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_readme_results_block_matches_the_json(name, tmp_path):
  folder = ROOT / "experiments" / name
  results = tmp_path / "results"
  shutil.copytree(folder / "results", results)  # figures are redrawn here, not in the tree
  module = report.load_module(folder)
  hint = f"run: python -m specjax.report {folder}"
  assert _block(folder / "README.md") == module.report(results).strip(), hint
  if hasattr(module, "details"):
    assert _block(folder / "notes.md") == module.details(results).strip(), hint


def test_details_fill_the_notes_beside_the_readme(tmp_path):
  folder = tmp_path / "exp"
  (folder / "results").mkdir(parents=True)
  (folder / "report.py").write_text(
    "def report(d):\n  return 'headline'\ndef details(d):\n  return 'every table'\n"
  )
  (folder / "README.md").write_text("# exp\n\n<!-- results -->\nold\n<!-- /results -->\n")
  (folder / "notes.md").write_text("# notes\n\n<!-- results -->\n<!-- /results -->\n\nprose\n")
  assert report.render(folder) == [folder / "README.md", folder / "notes.md"]
  assert "<!-- results -->\nheadline\n<!-- /results -->" in (folder / "README.md").read_text()
  notes = (folder / "notes.md").read_text()
  assert notes == "# notes\n\n<!-- results -->\nevery table\n<!-- /results -->\n\nprose\n"
  # notes.md without its block, or missing: one error, and the README is left as it was.
  (folder / "README.md").write_text("<!-- results -->\nold\n<!-- /results -->\n")
  for text, message in (("# notes\n", "notes.md has no <!-- results -->"), (None, "no notes.md")):
    if text is None:
      (folder / "notes.md").unlink()
    else:
      (folder / "notes.md").write_text(text)
    with pytest.raises(SystemExit) as e:
      report.main([str(folder)])
    assert str(e.value.code).startswith("error: ") and message in str(e.value.code)
    assert (folder / "README.md").read_text() == "<!-- results -->\nold\n<!-- /results -->\n"


def test_missing_results_leave_the_readme_as_it_is(tmp_path):
  """An experiment whose results are not there (a fresh clone of a folder, a run not yet made):
  a results file its report reads and does not find, or nothing to report over a README that has
  results, is one error naming it, and the README is left as it was."""
  folder = tmp_path / "exp"
  folder.mkdir()
  readme = "# exp\n\n<!-- results -->\n| a |\n|---|\n| 1 |\n<!-- /results -->\n"
  (folder / "README.md").write_text(readme)
  reports = {
    "def report(d):\n  return (d / 'run.json').read_text()\n": "run.json is missing",
    "def report(d):\n  return ''\n": "holds nothing to report",
  }
  for code, message in reports.items():
    (folder / "report.py").write_text(code)
    with pytest.raises(SystemExit) as e:
      report.main([str(folder)])
    assert str(e.value.code).startswith("error: ") and message in str(e.value.code)
    assert (folder / "README.md").read_text() == readme
  # An empty block may stay empty (an experiment not run yet has nothing to show).
  (folder / "README.md").write_text("<!-- results -->\n<!-- /results -->\n")
  assert report.render(folder) == [folder / "README.md"]
  assert (folder / "README.md").read_text() == "<!-- results -->\n<!-- /results -->\n"
