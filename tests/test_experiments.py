"""Every experiment README's results block is what its report() renders from the committed JSON:
no number in the docs is typed by hand or left stale."""

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


def test_there_are_experiments_to_check():
  assert {"losslessness", "speculative_theory", "eagle_smollm2"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_readme_results_block_matches_the_json(name, tmp_path):
  folder = ROOT / "experiments" / name
  results = tmp_path / "results"
  shutil.copytree(folder / "results", results)  # figures are redrawn here, not in the tree
  want = report.load(folder)(results).strip()
  text = (folder / "README.md").read_text()
  got = re.search(re.escape(report.BEGIN) + r"(.*?)" + re.escape(report.END), text, re.S)
  assert got is not None and got[1].strip() == want, f"run: python -m specjax.report {folder}"
