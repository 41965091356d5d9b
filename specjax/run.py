"""Entry point: ``python -m specjax.run --config=configs/NAME.py [--config.key=value ...]``."""

import importlib
import re
import sys

from absl import app, flags
from ml_collections import config_flags

# task name -> module under specjax.tasks with run(config); imported only when chosen.
TASKS = {
  "generate": "generate",
  "benchmark": "benchmark",
  "train": "train",
  "self_distill": "self_distill",
  "sweep": "sweep",
  "verify_cost": "verify_cost",
  "max_len": "max_len",
  "feature_cost": "feature_cost",
  "medusa_tree": "medusa_tree",
}
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Experiment config file.", lock_config=True
)


def parse_flags(argv: list[str]) -> list[str]:
  """Parses flags; a misspelt ``--config.key`` becomes one line naming the key and the fix."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    key = re.search(r"'([^'\\]+)", str(e))
    guess = re.search(r'Did you mean "([^"]+)"', str(e))
    hint = f"; did you mean {guess.group(1)!r}?" if guess else ""
    sys.exit(
      f"error: --config.{key.group(1) if key else '?'} is not a config field{hint} "
      "(the fields are those of the config file's get_config())."
    )


def main(argv):
  del argv
  config = _CONFIG.value
  if config.task not in TASKS:
    raise app.UsageError(
      f"config.task={config.task!r} is unknown; choose one of {', '.join(TASKS)}."
    )
  importlib.import_module(f"specjax.tasks.{TASKS[config.task]}").run(config)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
