"""Several command lines of ``python -m specjax.run``, one after another in one process.

    python tests/cli_worker.py '[["--config=configs/tiny.py", "--config.task=fly"], []]'

Each argument list goes through what ``python -m specjax.run ARGS`` runs (absl's ``app.run``
with specjax.run's ``main`` and ``parse_flags``), with ``sys.argv`` set to it (ml_collections
reads the ``--config.*`` overrides from there); the flags are unparsed and the overrides' flags
removed afterwards, so each case starts from its config file as a fresh process would. Prints
one line ``RESULT {json}``: per case, ``[exit status, stderr]``, where a ``sys.exit(message)``
counts as status 1 with its message on stderr, as the interpreter would print it. For the
config-error tests, whose cases end before any model loads: one interpreter and one JAX import
for all of them instead of one each (~2 s apiece here); tests/test_run.py still runs the real
command line for one case.
"""

import contextlib
import io
import json
import os
import sys
from pathlib import Path

from absl import app, flags

from specjax import run


def run_one(args: list[str]) -> tuple[int, str]:
  err = io.StringIO()
  argv = ["specjax.run", *args]
  sys.argv = argv
  status = 0
  with contextlib.redirect_stderr(err):
    try:
      app.run(run.main, argv=argv, flags_parser=run.parse_flags)
    except SystemExit as e:
      if isinstance(e.code, str):
        print(e.code, file=sys.stderr)
        status = 1
      else:
        status = e.code or 0
    finally:
      flags.FLAGS.unparse_flags()
      for name in [n for n in flags.FLAGS if n.startswith("config.")]:
        delattr(flags.FLAGS, name)  # the overrides' flags are defined afresh by the next case
  return status, err.getvalue()


if __name__ == "__main__":
  os.chdir(Path(__file__).resolve().parents[1])  # config paths are given from the repository root
  print("RESULT " + json.dumps([run_one(args) for args in json.loads(sys.argv[1])]))
