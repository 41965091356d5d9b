"""``config.profile``: a trace of warmed work that TensorBoard's profile plugin or XProf opens.

    python -m specjax.run --config=configs/demo.py --config.profile=results/profile
    tensorboard --logdir results/profile      # or: xprof --logdir results/profile

``task=generate`` and ``task=benchmark`` trace one more speculative decode of the first batch
after the run (compiled by then, so the trace shows the decode loop's own work: the drafter,
the verify forward, the cache writes); ``task=train`` traces ``config.profile_steps`` optimiser
steps after its first. The trace is ``jax.profiler.trace``'s: ``plugins/profile/<run>/`` under
the directory.
"""

import contextlib
from pathlib import Path

import jax
from tqdm.auto import tqdm

from specjax import results

TASKS = ("generate", "benchmark", "train")


def check(config) -> None:
  """``config.profile``: a writable directory, for a task that traces; before anything loads."""
  directory = config.get("profile") if config is not None else None
  if not directory:
    return
  if config.task not in TASKS:
    raise ValueError(
      f"config.profile={directory!r}: task={config.task!r} does not trace; profile one of "
      f"task={', '.join(TASKS)} (or leave config.profile empty)."
    )
  results.check_writable(directory, "config.profile")
  if config.task == "train" and not config.get("profile_steps", 3) >= 1:
    raise ValueError(f"config.profile_steps must be >= 1, got {config.profile_steps}.")


@contextlib.contextmanager
def trace(directory, what: str):
  """``jax.profiler.trace`` into ``directory``, saying where it went."""
  with jax.profiler.trace(str(directory)):
    yield
  found = sorted(Path(directory).glob("plugins/profile/*/*.xplane.pb"))
  tqdm.write(
    f"profile of {what}: {found[-1] if found else directory} (tensorboard --logdir {directory})"
  )


def decode(config, call, batch) -> None:
  """One more ``call(batch)`` (a warmed decode) under the profiler, if ``config.profile``."""
  if config.get("profile"):
    with trace(config.profile, "one warmed decode of the first batch"):
      jax.block_until_ready(call(batch).tokens)
