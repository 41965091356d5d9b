"""Entry point: ``python -m specjax.run --config=configs/NAME.py [--config.key=value ...]``.

Bad input (a ValueError from the checks) ends the process with one line naming the field and
the fix, exit status 1; ``SPECJAX_TRACEBACK=1`` shows the traceback instead. Ctrl-C exits at
once with status 130.
"""

import difflib
import importlib
import importlib.util
import logging
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

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
  "device_bench": "device_bench",
  "losslessness": "losslessness",
  "cost_model": "cost_model",
  "peers": "peers",
  "specbench": "specbench",
  "export_drafter": "export_drafter",
  "promote": "promote",
}
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Experiment config file.", lock_config=True
)


def _config_arg(argv: list[str]) -> str | None:
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def load_config_file(value: str):
  """Builds the config of ``--config=PATH[:ARG]`` on its own, so an error inside the file is
  reported as the file's, not as a command-line field's."""
  path, _, arg = value.partition(":")
  if not Path(path).is_file():
    sys.exit(f"error: --config={value}: no such file {path!r} (e.g. --config=configs/demo.py).")
  spec = importlib.util.spec_from_file_location("_specjax_config_check", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
      sys.exit(f"error: {path} defines no get_config(): a config file must (see configs/).")
    return module.get_config(arg) if arg else module.get_config()
  except SystemExit:
    raise
  except Exception as e:  # the file's own bug: name it and where it happened
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f for f in reversed(tb) if f.filename.startswith(str(Path(path).parent))), tb[-1])
    sys.exit(
      f"error: {path} failed building its config ({where.filename}:{where.lineno}): "
      f"{type(e).__name__}: {e}"
    )


def _override_error(argv: list[str], config, e: Exception) -> str:
  """The first ``--config.a.b=v`` whose path the config lacks, and the fix."""
  for a in argv:
    if not a.startswith("--config."):
      continue
    keys = a[len("--config.") :].split("=", 1)[0].split(".")
    node, seen = config, []
    for k in keys:
      if not hasattr(node, "keys") or k not in node:
        fields = sorted(node.keys()) if hasattr(node, "keys") else []
        close = difflib.get_close_matches(k, fields, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        where = f"config.{'.'.join(seen)}" if seen else "the config"
        return (
          f"error: --config.{'.'.join(keys)}: {where} has no field {k!r}{hint} (the fields are "
          "those of the config file's get_config())."
        )
      node, seen = node[k], seen + [k]
  return f"error: bad --config override: {e}"


def _type_name(value) -> str:
  if hasattr(value, "keys"):
    return "a dict (a config section)"
  kind = type(value).__name__
  return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _value_error(argv: list[str], config, e: Exception) -> str:
  """The ``--config.a.b=v`` whose value does not parse as the field's type: one line naming the
  field, its type and the value given."""
  for a in argv:
    if not a.startswith("--config.") or "=" not in a:
      continue
    name, value = a[len("--config.") :].split("=", 1)
    if not str(e).startswith(f"flag --config.{name}={value}:"):
      continue
    node = config
    for k in name.split("."):
      node = node[k]
    why = str(e).split(": ", 1)[1].split("\n")[0]
    now = "" if hasattr(node, "keys") else f" (the config file gives {node!r:.40})"
    return (
      f"error: --config.{name}={value}: config.{name} is {_type_name(node)}{now}; {value!r} is "
      f"not one ({why})."
    )
  return f"error: bad --config override: {e}"


def parse_flags(argv: list[str]) -> list[str]:
  """Parses flags; a config file that fails to build is reported as the file's error, and a
  misspelt ``--config.key`` as one line naming the key and the fix."""
  value = _config_arg(argv)
  if value is None:
    sys.exit("error: --config is missing: pass --config=configs/NAME.py (e.g. configs/demo.py).")
  config = load_config_file(value)
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    sys.exit(_override_error(argv, config, e))
  except flags.IllegalFlagValueError as e:
    sys.exit(_value_error(argv, config, e))


def exit_on_interrupt() -> None:
  """Ctrl-C ends the process at once with status 130, even inside a long XLA compile or
  computation, where a Python handler would only run when the C++ call returns (and unwinding
  through it crashed). The interpreter's C-level handler writes the signal to a pipe; a thread
  blocked on it exits. The main thread's Python handler does nothing: with the default one, a
  busy machine let the main thread raise KeyboardInterrupt before the thread ran, so the
  process unwound and shut down instead (once, in the test suite, it had not exited 30 s
  later). Every file specjax writes is written to a temporary name and renamed, so nothing
  half-written is left behind."""
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  signal.set_wakeup_fd(write_fd)
  signal.signal(signal.SIGINT, lambda signum, frame: None)  # the thread below handles it

  def watch():
    while True:
      if os.read(read_fd, 1) == bytes([signal.SIGINT]):
        sys.stderr.write("\ninterrupted\n")
        sys.stderr.flush()
        os._exit(130)

  threading.Thread(target=watch, daemon=True, name="specjax-interrupt").start()


def quiet_backend_probe() -> None:
  """JAX logs at INFO every backend it tried and could not start ("Unable to initialize backend
  'tpu'"), which absl's handler prints at the top of every run on a CPU or GPU machine; its
  warnings still show."""
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


# Overrides that leave an experiment's recipe as its config file gives it.
_NOT_THE_RECIPE = {"workdir", "record_to"}


def keep_the_recipes_record(config, overrides) -> str | None:
  """A config file's ``record_to`` (an experiment's committed results) is written only by the
  recipe the file gives: a command line that changes any other field (other data, steps,
  settings) keeps its record in its workdir instead, unless it names ``record_to`` itself.
  Returns the line that says so, or None where the record goes where the file says."""
  changed = sorted(set(overrides) - _NOT_THE_RECIPE)
  if config.task != "train" or not config.get("record_to") or "record_to" in overrides:
    return None
  if not changed:  # the recipe itself, perhaps in another workdir
    return None
  where = config.record_to
  config.record_to = ""
  return (
    f"note: config.record_to={where!r} is left as it is: the command line changes the recipe "
    f"({', '.join(changed[:4])}{', ...' if len(changed) > 4 else ''}), so the record stays in "
    "config.workdir (--config.record_to=DIR writes it elsewhere)."
  )


def main(argv):
  if len(argv) > 1:  # absl leaves what is not a flag; a setting there would be ignored
    sys.exit(
      f"error: unexpected argument {argv[1]!r}: settings are flags, --config.FIELD=VALUE "
      "(e.g. --config.temperature=0.7)."
    )
  exit_on_interrupt()
  quiet_backend_probe()
  config = _CONFIG.value
  if config.task not in TASKS:
    sys.exit(f"error: config.task={config.task!r} is unknown; choose one of {', '.join(TASKS)}.")
  if note := keep_the_recipes_record(
    config, config_flags.get_override_values(flags.FLAGS["config"])
  ):
    print(note, file=sys.stderr)
  run_task(importlib.import_module(f"specjax.tasks.{TASKS[config.task]}"), config)


def run_task(task, config) -> None:
  """``task.run(config)``; bad input (ValueError), or training that turned non-finite
  (FloatingPointError), ends the process with one line naming the cause and the fix."""
  from specjax import profiling

  try:
    profiling.check(config)
    task.run(config)
  except (ValueError, FloatingPointError) as e:
    if os.environ.get("SPECJAX_TRACEBACK"):
      raise
    sys.exit(f"error: {e}\n(SPECJAX_TRACEBACK=1 shows where it was raised)")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
