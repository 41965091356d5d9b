"""The training_free experiment's report: the README's results block,
from results/.

    python -m specjax.report experiments/training_free
"""

import json

from specjax.measure import sweep


def report(results_dir):
  """The README's results block, from results/{b1,b4}/sweep.json."""

  out = []
  for arg in ("b1", "b4"):
    path = results_dir / arg / "sweep.json"
    if not path.exists():
      continue
    out += [sweep.markdown(json.loads(path.read_text()))]
  return "\n".join(out)
