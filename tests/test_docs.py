"""The documented commands run as written: every ``python -m specjax.run`` line of README.md and
docs/*.md parses through the command line's own flags and its config passes ``build.check``
(the checks every run makes before any work: fields, files, drafters, budgets)."""

import re
import shlex
from pathlib import Path

import pytest
from absl import flags
from ml_collections import config_flags

from specjax import build

ROOT = Path(__file__).resolve().parents[1]
# A command naming the user's own files or a placeholder is the reader's to fill in.
PLACEHOLDERS = ("PATH", "NAME", "RUN/", "/path/to", "chats/", "prompts.jsonl", "Spec-Bench/")
# Commands whose checks need what the doc sets up beside them: more devices, a second process,
# or the drafter the command before them trains.
NEEDS_SETUP = ("--config.mesh.", "--config.distributed.", "distill_draft_smollm2.py:benchmark")


def documented_commands() -> list[tuple[str, str]]:
  """``(file, command)`` for every ``python -m specjax.run`` line of the docs, its ``\\``
  continuations joined and its trailing ``# comment`` cut."""
  out = []
  for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
      at = line.find("python -m specjax.run")
      if at < 0 or "`" in line[:at]:  # prose naming the command, not a command line
        continue
      cmd, j = line[at:], i
      while cmd.rstrip().endswith("\\"):
        j += 1
        cmd = cmd.rstrip()[:-1] + " " + lines[j].strip()
      out.append((path.name, re.split(r"\s+#", cmd)[0].strip()))
  return out


COMMANDS = documented_commands()
RUNNABLE = [(f, c) for f, c in COMMANDS if not any(p in c for p in PLACEHOLDERS + NEEDS_SETUP)]


def test_the_docs_hold_commands_and_most_run_here():
  assert len(COMMANDS) > 50 and len(RUNNABLE) >= 40


@pytest.mark.usefixtures("_source_tree_kept")
@pytest.mark.parametrize("doc, command", RUNNABLE, ids=[f"{f}:{c[22:70]}" for f, c in RUNNABLE])
def test_a_documented_command_parses_and_passes_its_checks(doc, command, monkeypatch):
  monkeypatch.chdir(ROOT)
  argv = shlex.split(command)[2:]  # "specjax.run" and its flags, after "python -m"
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", values, lock_config=True, sys_argv=argv)
  values(argv)
  build.check(values.config)
