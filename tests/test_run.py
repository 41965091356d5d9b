"""The entry point: python -m specjax.run, its tasks, and its config errors."""

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from ml_collections import config_dict

from configs import tiny
from experiments.eagle_smollm2 import config as eagle_smollm2
from experiments.medusa_smollm2 import config as medusa_smollm2
from specjax import build, report
from specjax.measure import sweep, timing
from specjax.models import llama
from specjax.tasks import benchmark, feature_cost, max_len


def _run(*overrides, cwd):
  cmd = [sys.executable, "-m", "specjax.run", "--config=configs/tiny.py", *overrides]
  return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.fixture
def small_config():
  c = tiny.get_config()
  c.target.update(vocab_size=64, dim=32, num_layers=2, num_heads=2, num_kv_heads=1, ffn_dim=64)
  c.update(max_new_tokens=12, max_len=40, batch_size=2)
  c.drafter.draft_model.num_draft = 2
  c.benchmark.repeats = 1
  return c


@pytest.mark.slow
def test_sweep_over_categories_and_drafters(small_config, tmp_path):
  c = small_config
  c.output_dir = str(tmp_path)
  c.sweep = config_dict.ConfigDict()
  c.sweep.batch_sizes = (2,)
  c.sweep.verify_sizes = (1, 4)
  c.sweep.categories = {"repeats": ((1, 2, 3, 1, 2, 3),), "random": ((5, 9, 11),)}
  c.sweep.variants = {
    "lookup_tree": {"name": "prompt_lookup", "prompt_lookup": {"num_branches": 2}},
    "lookahead": {"name": "lookahead", "lookahead": {"window": 3, "ngram": 3, "num_candidates": 2}},
  }
  c.sweep.temperatures = (0.0, 1.0)
  record = sweep.run(c)
  saved = json.loads((tmp_path / "sweep.json").read_text())
  assert len(saved["runs"]) == 2 * 2 * 3 == len(record["runs"])
  greedy = [r for r in saved["runs"] if r["temperature"] == 0]
  assert len(greedy) == 6 and all(r["identical"] for r in greedy)
  assert all("identical" not in r for r in saved["runs"] if r["temperature"] == 1)
  assert [r["tokens"] for r in saved["verify_cost"]] == [1, 4]
  assert {(s["temperature"], s["batch"], s["variant"]) for s in saved["summary"]} == {
    (t, 2, v) for t in (0.0, 1.0) for v in ("ar", "lookup_tree", "lookahead")
  }
  c.sweep.temperatures = (0.0, -1.0)
  with pytest.raises(ValueError, match="sweep.temperatures"):
    sweep.run(c)


@pytest.mark.slow
def test_sweep_resume_keeps_finished_jobs_and_measures_others(small_config, tmp_path, monkeypatch):
  """``sweep.resume``: jobs an interrupted run left in sweep.json are kept as they were (marked
  runs stay marked), the others are measured; a complete file loads no model and is left as it
  is; without the option everything is measured again; a file from another config is refused
  before any model loads."""
  c = small_config
  c.output_dir = str(tmp_path)
  c.sweep = sweep.default_config()
  c.sweep.batch_sizes = (2,)
  c.sweep.categories = {"repeats": ((1, 2, 3, 1, 2, 3),), "random": ((5, 9, 11),)}
  c.sweep.variants = {"lookup": {"name": "prompt_lookup"}}
  path = tmp_path / "sweep.json"
  whole = sweep.run(c)
  interrupted = json.loads(path.read_text())  # as if stopped after the first category
  mark = {"tokens_per_s": -1.0, "speedup": -1.0}
  interrupted["runs"] = [r | mark for r in interrupted["runs"][:2]]
  path.write_text(json.dumps(interrupted))
  first = interrupted["runs"][0]["category"]
  (second,) = {"repeats", "random"} - {first}

  c.sweep.resume = True
  record = sweep.run(c)
  assert record["kept"] == {"jobs": 1, "machines": [interrupted["machine"]]}
  runs = json.loads(path.read_text())["runs"]
  by = {(r["category"], r["variant"]): r for r in runs}
  assert len(runs) == len(by) == 4
  assert by[first, "ar"]["tokens_per_s"] == by[first, "lookup"]["speedup"] == -1.0  # kept
  assert by[second, "ar"]["tokens_per_s"] > 0 and by[second, "lookup"]["identical"]
  for key in (first, "lookup"), (second, "lookup"):  # greedy: the same tokens again
    assert by[key]["target_calls"] == next(
      r["target_calls"] for r in whole["runs"] if (r["category"], r["variant"]) == key
    )
  lookup = next(s for s in record["summary"] if s["variant"] == "lookup")
  assert lookup["mean_speedup"] == pytest.approx((by[second, "lookup"]["speedup"] - 1) / 2)

  written = path.read_text()
  with monkeypatch.context() as m:  # every job done: the tables again, no model loaded
    m.setattr(build, "target", lambda config: pytest.fail("loaded a model"))
    again = sweep.run(c)
  assert again == json.loads(written) and path.read_text() == written  # the file as it was

  c.sweep.resume = False
  sweep.run(c)
  assert all(r["tokens_per_s"] > 0 for r in json.loads(path.read_text())["runs"])

  c.sweep.resume = True
  c.max_new_tokens = 10
  monkeypatch.setattr(build, "target", lambda config: pytest.fail("loaded a model"))
  with pytest.raises(ValueError, match=r"sweep.resume: .*config.max_new_tokens: move it away"):
    sweep.run(c)


@pytest.mark.slow
def test_sweep_variant_sets_its_own_verifier_and_log_likelihood_is_recorded(small_config, tmp_path):
  """A variant's ``verifier``/``typical`` keys reach its decode only: typical acceptance with a
  bar near 0 keeps every draft token, the lossless variant of the same drafter does not;
  ``sweep.log_likelihood`` records the target's mean log-probability per token."""
  c = small_config
  c.update(output_dir=str(tmp_path), temperature=1.0)
  c.sweep = config_dict.ConfigDict()
  c.sweep.batch_sizes = (2,)
  c.sweep.verify_sizes = ()
  c.sweep.categories = {"random": ((5, 9, 11), (3, 1))}
  draft = {"name": "draft_model"}
  c.sweep.variants = {
    "lossless": draft,
    "typical": draft | {"verifier": "typical", "typical": {"epsilon": 1e-9, "delta": 1e-9}},
  }
  c.sweep.log_likelihood = True
  runs = {r["variant"]: r for r in sweep.run(c)["runs"]}
  assert runs["typical"]["alpha"] == [1.0, 1.0]
  assert runs["lossless"]["alpha"] != [1.0, 1.0]  # the same drafter, verified losslessly
  assert all(-np.log(64) * 3 < r["log_likelihood"] < 0 for r in runs.values())


def test_log_likelihood_is_the_unpadded_teacher_forced_sum(small_target):
  cfg, params = small_target
  target = types.SimpleNamespace(cfg=cfg, params=params)
  rows = [([1, 2, 3], [4, 5]), ([7], [8, 9, 10, 11])]
  want = []
  for prompt, new in rows:
    text = np.asarray([prompt + new])
    logp = jax.nn.log_softmax(llama.logits_of(params, cfg, text)[0][0])
    want += [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(new)]
  got = sweep.log_likelihood(target, rows, length=16)
  assert got == pytest.approx(np.mean(want), rel=1e-5)


def test_benchmark_writes_json_record(small_config, tmp_path, capsys):
  small_config.output_dir = str(tmp_path)
  record = benchmark.run(small_config)
  saved = json.loads((tmp_path / "benchmark.json").read_text())
  assert saved["summary"]["greedy_outputs_identical"] is True
  for mode in ("ar", "speculative", "draft_ar"):
    m = saved["modes"][mode]
    for key in (
      "tokens",
      "target_calls",
      "tau",
      "alpha",
      "compile_s",
      "steady_s",
      "tokens_per_s",
      "speedup",
      "accept_hist",
    ):
      assert key in m, (mode, key)
  assert record["modes"]["ar"]["tau"] == 1.0
  assert "speculative" in capsys.readouterr().out


def test_timed_passes_interleave_the_modes_batch_by_batch(monkeypatch):
  """Modes take turns per batch (order rotated), so a ratio of two modes' times is taken over
  the same stretch of a drifting machine; each mode's time sums its own batches only."""
  calls, clock = [], [0.0]
  cost = {"a": 1.0, "b": 10.0, "c": 100.0}

  def mode(name):
    def fn(batch):
      calls.append((name, batch))
      clock[0] += cost[name] * (1 + batch)
      return (name, batch)

    return fn

  monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
  timed = timing.run_modes({m: mode(m) for m in cost}, [0, 1, 2, 3], repeats=2)
  first, passes = calls[:12], calls[12:]
  assert first == [(m, b) for m in cost for b in range(4)]  # compile + warm-up, mode by mode
  rotated = ["abc", "bca", "cab", "abc"]  # batch i starts at mode i mod 3
  assert passes == 2 * [(m, b) for b, order in enumerate(rotated) for m in order]
  for m, c in cost.items():
    assert timed[m]["steady_all_s"] == [c * 10, c * 10]  # 1 + 2 + 3 + 4 batch units
    assert timed[m]["steady_s"] == c * 10 and timed[m]["first_pass_s"] == c * 10
    assert timed[m]["outs"] == [(m, b) for b in range(4)]


_BAD_OVERRIDES = [  # a --config.* override of configs/tiny.py, and what its one line says
  ("--config.drafter.name=hydra", "drafter.name='hydra' is unknown"),
  ("--config.task=fly", "config.task='fly' is unknown"),
  ("--config.tempreature=0.5", "did you mean 'temperature'"),
  ("--config.top_p=1.5", "top_p must be in (0, 1]"),
  ("--config.drafter.draft_model.num_draft=0", "draft_model.num_draft (K) must be an integer >= 1"),
  ("--config.drafter.prompt_lookup.max_ngrm=2", "did you mean 'max_ngram'"),
]


def _bad_config_files(d: Path) -> list[tuple[tuple[str, ...], str]]:
  """Command lines whose config file, or a field the config lacks, is at fault, and what the
  one line says."""
  (d / "noget.py").write_text("x = 1\n")
  (d / "recipe.py").write_text(  # an experiment's recipe, whose record is committed
    "from configs import train_tiny\ndef get_config():\n  c = train_tiny.get_config()\n"
    f"  c.workdir, c.record_to = {str(d / 'work')!r}, {str(d / 'committed')!r}\n  return c\n"
  )
  (d / "typo.py").write_text(
    "from configs import tiny\ndef get_config():\n  c = tiny.get_config()\n"
    "  return c.drafter.nosuch_section\n"
  )
  return [
    ((), "--config is missing"),
    ((f"--config={d}/noget.py",), "defines no get_config()"),
    (("--config=configs/tiny.py", "temperature=0.7"), "unexpected argument 'temperature=0.7'"),
    ((f"--config={d}/recipe.py", "--config.train.steps=0"), "train.steps must be >= 1, got 0"),
    ((f"--config={d}/typo.py",), "typo.py failed building its config (" + str(d)),
    (("--config=configs/tiny.py", "--config.target.nme=x"), "config.target has no field 'nme'"),
    (("--config=configs/demo.py", "--config.target.source=gguf",
      "--config.target.path=/no/model.gguf"), "config.target.path='/no/model.gguf' does not exist"),
  ]  # fmt: skip


@pytest.fixture(scope="module")
def cli_errors(tmp_path_factory):
  """``(file cases, {command line: (exit status, stderr)})``: every bad command line of this
  file through specjax.run's entry point, all in one tests/cli_worker.py process."""
  import train_worker

  files = _bad_config_files(tmp_path_factory.mktemp("cli"))
  lines = [args for args, _ in files] + [("--config=configs/tiny.py", o) for o, _ in _BAD_OVERRIDES]
  got = train_worker.run_subprocess(lines, timeout=600, script="cli_worker.py")
  return files, dict(zip(lines, map(tuple, got), strict=True))


@pytest.mark.multiprocess
def test_the_command_line_ends_on_bad_config_with_one_line(request):
  """``python -m specjax.run`` itself, on one bad config: exit status 1 and one error line
  naming the field (the other bad command lines run through the same entry point in one
  process, below)."""
  proc = _run("--config.top_p=1.5", cwd=request.config.rootpath)
  assert proc.returncode == 1, proc.stderr[-400:]
  lines = [ln for ln in proc.stderr.splitlines() if "rror" in ln and "TRACEBACK" not in ln]
  assert len(lines) == 1 and "top_p must be in (0, 1]" in lines[0], proc.stderr[-400:]


@pytest.mark.multiprocess
@pytest.mark.parametrize("override, message", _BAD_OVERRIDES)
def test_cli_rejects_bad_config(override, message, cli_errors):
  status, stderr = cli_errors[1][("--config=configs/tiny.py", override)]
  assert status == 1, stderr[-400:]
  assert message in stderr


@pytest.mark.multiprocess
def test_cli_names_the_config_file_or_the_field_at_fault(cli_errors):
  """A missing --config, a file without get_config, a bug inside the file and a field the
  config lacks each give one line naming what is wrong (exit 1), before any model loads; a
  target path can be given on the command line."""
  files, results = cli_errors
  for args, message in files:
    status, stderr = results[args]
    assert status == 1, (args, stderr[-400:])
    lines = [ln for ln in stderr.splitlines() if "rror" in ln and "TRACEBACK" not in ln]
    assert message in stderr, (args, stderr[-400:])
    assert len(lines) == 1, lines


@pytest.mark.multiprocess
def test_a_changed_recipe_keeps_its_record_out_of_the_experiments(cli_errors):
  """A train config file's ``record_to`` (an experiment's committed results) is left alone by
  a command line that changes the recipe: the entry point says so, before the task's checks."""
  files, results = cli_errors
  ((args, _),) = [(a, m) for a, m in files if a and a[0].endswith("recipe.py")]
  note = "note: config.record_to='" + str(Path(args[0][len("--config=") :]).parent / "committed")
  assert (
    note + "' is left as it is: the command line changes the recipe (train.steps)"
    in (results[args][1])
  )


@pytest.mark.parametrize(
  "overrides, written",
  [
    ({}, True),  # the recipe as its file gives it
    ({"workdir": "/elsewhere"}, True),  # the recipe, run in another workdir
    ({"record_to": "/mine"}, True),  # the user names where the record goes
    ({"data.files": ("chats/*.jsonl",), "data.sources": ()}, False),  # README's own-data run
    ({"train.steps": 10}, False),
  ],
)
def test_only_the_recipe_writes_the_experiments_record(overrides, written):
  from specjax import run

  c = config_dict.ConfigDict({"task": "train", "record_to": "experiments/x/results/v"})
  if "record_to" in overrides:
    c.record_to = overrides["record_to"]
  note = run.keep_the_recipes_record(c, overrides)
  assert (note is None) == written and bool(c.record_to) == written
  c.task = "sweep"  # only task=train writes a record
  assert run.keep_the_recipes_record(c, {"train.steps": 10}) is None


@pytest.mark.parametrize(
  "override, message",
  [
    ({"temperature": float("inf")}, "temperature must be finite"),
    ({"seed": -1}, "config.seed must be an integer in"),
    ({"benchmark.repeats": 0}, "config.benchmark.repeats must be >= 1"),
    ({"prompts": ("fine", "bad \ud800 text")}, r"config.prompts\[1\] is not valid Unicode"),
    ({"task": "benchmark", "output_dir": "FILE"}, "is a file, not a directory"),
    ({"task": "benchmark", "output_dir": "/proc/specjax-out"}, "is not writable"),
    ({"task": "train", "workdir": "FILE"}, "config.workdir="),
    ({"task": "benchmark", "output_dir": ""}, r"config.output_dir is empty: name the directory"),
    ({"task": "train", "workdir": " "}, r"config.workdir is empty"),  # not the current directory
    ({"task": "sweep", "output_dir": "~/runs"}, r"starts with ~, .*config.output_dir=\$HOME/runs"),
    # Checked with the rest of the config, not after compiling (a random target included).
    ({"max_new_tokens": 0}, r"config.max_new_tokens must be an integer >= 1 .*got 0"),
    ({"max_new_tokens": -3}, r"config.max_new_tokens must be an integer >= 1 .*got -3"),
    ({"max_len": 0}, r"config.max_len must be an integer >= 1 .*got 0"),
    (
      {"forward_rows": -2},
      r"config.forward_rows must be auto or an integer >= 0 \(0: off\), got -2",
    ),
    ({"max_len": 8}, r"> max_len 8: raise max_len .*\(config.max_len, config.max_new_tokens"),
    ({"prompts": ((1, 2), ())}, r"config.prompts\[1\] is empty"),
    ({"prompts": (1, 2, 3)}, r"config.prompts\[0\] is the number 1: .* e.g. --config.prompts="),
    ({"drafter.draft_model.num_layers": 2}, r"num_layers=2 must be in \[1, 2\) to truncate the"),
    ({"device_memory_gib": -1.0}, r"config.device_memory_gib=-1 must be a number of GiB > 0, or 0"),
    ({"prompts": ((1, 64),)}, r"config.prompts\[0\] has token ids outside \[0, 64\) .* 64 at pos"),
    ({"prompts": ((2, -1),)}, r"config.prompts\[0\] has token ids outside .* -1 at position 1"),
    ({"target.logit_std": float("nan")}, r"target.logit_std must be a finite number >= 0, got"),
    # A random target's sizes are named as the config's fields (were ModelConfig's).
    ({"target.num_kv_heads": 3}, r"^config.target.num_heads \(2\) must be a multiple of num_kv"),
    # An integer field given a float or a bool (was a TypeError after the target loaded, or a
    # bool decoded as 1).
    (
      {"drafter.name": "prompt_lookup", "drafter.prompt_lookup.num_draft": 4.0},
      r"config.drafter.prompt_lookup.num_draft \(K\) must be an integer >= 1, got 4.0",
    ),
    (
      {"drafter.name": "prompt_lookup", "drafter.prompt_lookup.num_draft": True},
      r"config.drafter.prompt_lookup.num_draft \(K\) must be an integer >= 1, got True",
    ),
    (
      {"drafter.draft_model.num_draft": 4.0},
      r"config.drafter.draft_model.num_draft \(K\) must be an integer >= 1, got 4.0",
    ),
    ({"drafter.draft_model.num_draft": True}, r"draft_model.num_draft \(K\) must .* got True"),
    (
      {"drafter.name": "eagle", "drafter.eagle.total": 12.0},
      r"config.drafter.eagle.total must be an integer >= 1, got 12.0",
    ),
    (
      {
        "drafter.name": "eagle",
        "drafter.eagle.total": True,
        "drafter.eagle.depth": 1,
        "drafter.eagle.top_k": 1,
      },
      r"config.drafter.eagle.total must be an integer >= 1, got True",
    ),  # fmt: skip
    ({"prompts": (None,)}, r"config.prompts\[0\] is None: each prompt is a text or a list of"),
    ({"prompts": ((1, None),)}, r"config.prompts\[0\] has an entry None that is not a token id"),
    # A trained drafter's path, before the target loads.
    ({"drafter.name": "eagle"}, r"config.drafter.eagle.path is empty: EAGLE decodes with a"),
    ({"drafter.name": "peagle"}, r"config.drafter.peagle.path is empty: P-EAGLE decodes with"),
    # The draft model's own sizes and its budget, before the target loads.
    (
      {"drafter.draft_model.source": "model", "drafter.draft_model.model.num_heads": 0},
      r"config.drafter.draft_model.model.num_heads",
    ),
    (
      {"drafter.draft_model.source": "model", "drafter.draft_model.model.vocab_size": 256},
      r"config.drafter.draft_model.model.vocab_size=256 differs from the target's 64",
    ),
    (
      {"drafter.draft_model.num_draft": 40},
      r"config.drafter.draft_model.num_draft=40 is more than config.drafter.max_depth=16",
    ),
    (
      {"forward_rows": 1_000_000},
      r"config.forward_rows=1000000 is more than .* config.drafter.max_nodes \+ 1 = 65",
    ),
  ],
)
def test_bad_config_fails_before_anything_loads(small_config, tmp_path, override, message):
  """Checked by ``build.check`` (every task runs it first): an output path that cannot take
  the results fails here, not after the run."""
  (tmp_path / "file").write_text("")
  c = small_config
  for key, value in override.items():
    value = str(tmp_path / "file") if value == "FILE" else value
    section, _, field = key.rpartition(".")
    (c[section] if section else c)[field] = value
  with pytest.raises(ValueError, match=message):
    build.check(c)


def test_a_batch_too_large_for_memory_is_refused_before_its_prompts_are_made(
  small_config, monkeypatch
):
  """A random target's prompts are made per row: a batch of 3e9 rows is refused by the memory
  check first (before, making its prompts hung the run)."""
  made = []
  real = build.request
  monkeypatch.setattr(build, "request", lambda *a, **kw: made.append(1) or real(*a, **kw))
  small_config.batch_size = 3_000_000_000
  with pytest.raises(ValueError, match=r"KV cache .*\(config.max_len, config.batch_size"):
    build.check(small_config)
  assert not made
  small_config.batch_size = 2  # and a batch that fits makes its prompts, checked
  build.check(small_config)
  assert made


@pytest.mark.parametrize(
  "output_dir, message",
  [("FILE", r"config.output_dir=.*' is a file"), ("/proc/specjax-out", "is not writable"),
   ("~/gen", r"starts with ~, .*config.output_dir=\$HOME/gen")],
)  # fmt: skip
def test_generate_on_a_mesh_checks_the_output_dir_it_writes(
  small_config, tmp_path, monkeypatch, output_dir, message
):
  """task=generate on a mesh writes its rows to output_dir: checked first (a file there was a
  FileExistsError after decoding, and ~ a literal directory); without a mesh it writes nothing
  there, so nothing is checked."""
  (tmp_path / "file").write_text("")
  c = small_config
  c.update(
    task="generate", output_dir=str(tmp_path / "file") if output_dir == "FILE" else output_dir
  )
  build.check(c)  # one device: no rows written
  two = types.SimpleNamespace(shape={"data": 2, "fsdp": 1, "tensor": 1})
  monkeypatch.setattr(build, "mesh", lambda config: two)
  with pytest.raises(ValueError, match=message):
    build.check(c)


def test_forward_rows_below_the_drafters_rows_is_named_before_compiling(small_config):
  """A drafter its config makes (prompt lookup's K = 4: 5 rows a step) is checked before
  anything loads; one that needs its weights (random Medusa heads: 9 nodes), once built, before
  compiling (both were refused inside generate, naming forward_rows without config.)."""
  c = small_config
  c.update(forward_rows=3)
  c.drafter.name = "prompt_lookup"
  with pytest.raises(ValueError, match=r"^config.forward_rows=3 is fewer than the 5 rows"):
    build.check(c)
  c.drafter.name = "medusa"
  c.drafter.medusa.tree_spec = (3, 2)
  build.check(c)
  with pytest.raises(ValueError, match=r"^config.forward_rows=3 is fewer than the 10 rows"):
    build.drafter(c, build.target(c))


@pytest.mark.parametrize(
  "num_draft, message",
  [(-1, r"^config.peers.num_draft must be an integer >= 1 .*got -1"),
   (0, r"^config.peers.num_draft must be an integer >= 1 .*got 0"),
   (20, r"^config.peers.num_draft=20 is more than config.drafter.max_depth=16")],
)  # fmt: skip
def test_peers_num_draft_is_checked_before_anything_loads(num_draft, message):
  """(-1 failed after loading the HF models, with transformers' own message.)"""
  from experiments.peers import config as peers_config
  from specjax.tasks import peers

  c = peers_config.get_config()
  c.peers.num_draft = num_draft
  with pytest.raises(ValueError, match=message):
    peers.check(c)


def test_verify_sizes_beyond_memory_are_refused_before_the_target_loads(
  small_config, tmp_path, monkeypatch
):
  """(1, 1e9) was an out-of-memory traceback after compiling."""
  monkeypatch.setattr(build, "target", lambda config: 1 / 0)  # nothing may load
  c = small_config
  c.update(task="verify_cost", output_dir=str(tmp_path))
  c.sweep = config_dict.ConfigDict({"verify_sizes": (1, 1_000_000_000)})
  with pytest.raises(ValueError, match=r"verify forward .* \(config.sweep.verify_sizes"):
    sweep.run_verify_cost(c)
  c.sweep.update(
    categories={"code": ((1, 2, 3),)}, variants={"l": {"name": "prompt_lookup"}}, batch_sizes=(1,)
  )
  with pytest.raises(ValueError, match=r"verify forward .* \(config.sweep.verify_sizes"):
    sweep.check(c)


def test_max_len_sizes_listed_twice_are_refused(small_config, monkeypatch):
  monkeypatch.setattr(build, "target", lambda config: 1 / 0)  # nothing may load
  small_config.max_len_sweep = config_dict.ConfigDict({"sizes": (40, 40)})
  with pytest.raises(ValueError, match=r"config.max_len_sweep.sizes=\(40, 40\) lists 40 twice"):
    max_len.run(small_config)


def test_sweep_resumed_over_a_damaged_sweep_json_names_it(small_config, tmp_path):
  c = small_config
  c.output_dir = str(tmp_path)
  c.sweep = config_dict.ConfigDict({"resume": True})
  (tmp_path / "sweep.json").write_text('{"config":\n')
  with pytest.raises(ValueError, match=r"sweep.json is not a sweep's JSON \(Expecting value at li"):
    sweep._resumed(c)


def test_hf_baseline_beside_a_random_target_is_refused_first(small_config, tmp_path, capsys):
  """benchmark.hf_baseline needs a registry model at batch 1: refused before anything compiles
  (it was refused after the whole benchmark)."""
  from specjax.tasks import benchmark

  c = small_config
  c.update(task="benchmark", output_dir=str(tmp_path))
  c.benchmark.hf_baseline = True
  with pytest.raises(ValueError, match=r"hf_baseline=True needs config.target.source='registry'"):
    benchmark.run(c)
  assert "compiling" not in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_sweep_category_without_prompts_is_named(small_config):
  c = small_config
  c.sweep = config_dict.ConfigDict()
  c.sweep.categories = {"code": ((1, 2, 3),), "chat": ()}
  c.sweep.variants = {"lookup": {"name": "prompt_lookup"}}
  with pytest.raises(ValueError, match=r"config.sweep.categories\['chat'\] has no prompts"):
    sweep.check(c)


@pytest.mark.parametrize(
  "variant, field",
  [
    ({"name": "prompt_lookup", "prompt_lookup": {"num_drft": 2}}, "drafter.prompt_lookup.num_drft"),
    ({"nme": "prompt_lookup"}, "drafter.nme"),  # would decode the default drafter as "lookup"
  ],
)
def test_sweep_variant_with_a_misspelt_field_is_named(small_config, variant, field):
  """A variant's key that config.drafter has no field of is refused before anything loads,
  instead of measuring the default under the variant's label."""
  c = small_config
  c.sweep = config_dict.ConfigDict()
  c.sweep.categories = {"code": ((1, 2, 3),)}
  c.sweep.batch_sizes = (1,)
  c.sweep.variants = {"lookup": variant, "ok": {"name": "prompt_lookup", "verifier": "typical"}}
  with pytest.raises(ValueError, match=rf"variants\['lookup'\] sets {field}, which config has"):
    sweep.check(c)
  del c.sweep.variants["lookup"]
  sweep.check(c)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("batch_sizes", (0,), r"config.sweep.batch_sizes=\(0,\) must list one or more batch sizes"),
    ("batch_sizes", (), r"config.sweep.batch_sizes=\(\) must list"),  # failed after measuring
    ("draft_ar", "lookupp", r"config.sweep.draft_ar='lookupp' must name a draft_model variant"),
    ("draft_ar", "lookup", r"draft_ar='lookup' must name a draft_model variant .*\(k2, lookup\)"),
    ("temperatures", (1e999,), r"config.sweep.temperatures=\(inf,\) must be finite numbers >= 0"),
    ("temperatures", (True,), r"config.sweep.temperatures=\(True,\) must be finite numbers"),
    ("temperatures", (0.0, 0.5, 0.0), r"config.sweep.temperatures=.* lists 0.0 twice"),
  ],
)
def test_sweep_sizes_and_draft_ar_are_checked_first(small_config, field, value, message):
  c = small_config
  c.sweep = config_dict.ConfigDict()
  c.sweep.categories = {"code": ((1, 2, 3),)}
  c.sweep.batch_sizes = (1, 2)
  c.sweep.variants = {"lookup": {"name": "prompt_lookup"}, "k2": {"name": "draft_model"}}
  c.sweep.draft_ar = "k2"
  sweep.check(c)
  c.sweep[field] = value
  with pytest.raises(ValueError, match=message):
    sweep.check(c)


@pytest.mark.parametrize(
  "variant, message",
  [
    ({"name": "hydra"}, r"^config.sweep.variants\['l'\].name='hydra' is unknown"),
    (
      {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 0}},
      r"^config.sweep.variants\['l'\].prompt_lookup.num_draft \(K\) must be an integer >= 1",
    ),
    ({"name": "prompt_lookup", "verifier": "lenient"}, r"^config.sweep.variants\['l'\].verifier="),
  ],
)
def test_a_bad_sweep_variant_is_named_as_the_variant(small_config, variant, message):
  c = small_config
  c.sweep = config_dict.ConfigDict()
  c.sweep.categories = {"code": ((1, 2, 3),)}
  c.sweep.batch_sizes = (1,)
  c.sweep.variants = {"l": variant}
  with pytest.raises(ValueError, match=message):
    sweep.check(c)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_ctrl_c_during_compilation_exits_130_at_once(request, tmp_path):
  """SIGINT while XLA compiles the demo's program: exit status 130 within 2 s, no core dump."""
  import signal
  import threading
  import time

  cmd = [sys.executable, "-m", "specjax.run", "--config=configs/demo.py",
         f"--config.output_dir={tmp_path}",
         "--config.drafter.prompt_lookup.num_draft=4",  # no timing first
         "--config.dtype=auto"]  # fmt: skip
  proc = subprocess.Popen(
    cmd, cwd=request.config.rootpath, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  out = ""
  deadline = time.monotonic() + 240  # loading the model
  while "compiling" not in out and time.monotonic() < deadline:  # the demo says what compiles
    line = proc.stdout.readline()
    assert line, f"the demo ended before compiling: {out[-500:]}"
    out += line
  # Keep reading: a full pipe would block the child's own writes (its progress bars, then the
  # "interrupted" line) and with them its exit.
  rest: list[str] = []
  reader = threading.Thread(target=lambda: rest.extend(proc.stdout), daemon=True)
  reader.start()
  time.sleep(1.0)  # inside the compile
  assert proc.poll() is None
  sent = time.monotonic()
  proc.send_signal(signal.SIGINT)
  rc = proc.wait(timeout=30)
  assert rc == 130 and time.monotonic() - sent < 2.0, (rc, time.monotonic() - sent)
  reader.join(timeout=10)
  assert "interrupted" in "".join(rest)


INTERRUPTED_MAIN = """
import signal, sys, time
from specjax import run
run.exit_on_interrupt()
try:
  signal.raise_signal(signal.SIGINT)  # the main thread runs its Python handler right here
  time.sleep(30)
except KeyboardInterrupt:
  sys.stdout.write("main thread interrupted\\n")
  sys.stdout.flush()
  time.sleep(30)
"""


@pytest.mark.multiprocess
def test_ctrl_c_never_reaches_the_main_thread(request):
  """Only the watching thread acts on SIGINT: the main thread gets no KeyboardInterrupt (on a
  busy machine it used to get one first and unwind, instead of exiting at once)."""
  proc = subprocess.run(
    [sys.executable, "-c", INTERRUPTED_MAIN], capture_output=True, text=True, timeout=60,
    cwd=request.config.rootpath,
  )  # fmt: skip
  assert proc.returncode == 130 and "interrupted" in proc.stderr, (proc.returncode, proc.stderr)
  assert "main thread interrupted" not in proc.stdout


def test_check_runs_before_loading(small_config):
  small_config.drafter.draft_model.num_layers = 5  # deeper than the 2-layer target
  with pytest.raises(ValueError, match="drafter.draft_model.num_layers"):
    build.drafter(small_config, build.target(small_config))


def test_locked_config_rejects_new_keys():
  c = tiny.get_config()
  c.lock()
  with pytest.raises(AttributeError, match="temperature"):
    c.tempreature = 1.0
  assert isinstance(c, config_dict.ConfigDict)


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(name="lookahead", max_nodes=8), "config.drafter.max_nodes=8"),
    (dict(name="prompt_lookup", prompt_lookup=dict(num_draft=20)), "config.drafter.max_depth=16"),
    (dict(name="prompt_lookup", prompt_lookup=dict(max_ngram=64)), "max_ngram=64"),
    (dict(name="lookahead", lookahead=dict(num_candidates=0)), "num_candidates"),
    (dict(name="lookahead", lookahead=dict(pool_size=2)), "pool_size=2"),
    (  # was an out-of-memory traceback after compiling
      dict(name="lookahead", lookahead=dict(pool_size=1_000_000_000)),
      "config.drafter.lookahead.pool_size=1000000000: the n-gram pools of config.batch_size=2",
    ),
  ],
)
def test_bad_tree_drafter_config(small_config, overrides, message):
  small_config.drafter.update(overrides)
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
    build.check(small_config)


def test_unknown_verifier(small_config):
  small_config.verifier = "lenient"
  with pytest.raises(ValueError, match="config.verifier='lenient' is unknown"):
    build.check(small_config)


@pytest.mark.slow
def test_max_len_task_times_every_size_and_keeps_the_text(small_config, tmp_path):
  c = small_config
  c.output_dir = str(tmp_path)
  c.max_len = 40
  c.max_len_sweep = config_dict.ConfigDict({"sizes": (40, 300)})  # 300: two attention windows
  record = max_len.run(c)
  saved = json.loads((tmp_path / "max_len.json").read_text())
  assert {(r["mode"], r["max_len"]) for r in saved["runs"]} == {
    (m, n) for m in ("ar", "draft_model") for n in (40, 300)
  }
  assert saved["greedy_texts_identical"] is True and record["runs"][0]["vs_smallest"] == 1.0
  # --config.max_len_sweep.sizes=abc arrives as ("a", "b", "c"): int('a')'s error named no field
  for bad in (("a", "b", "c"), (40, 1), (40.5,)):
    c.max_len_sweep = config_dict.ConfigDict({"sizes": bad})
    with pytest.raises(ValueError, match=r"config.max_len_sweep.sizes must be integers >= 2"):
      max_len.run(c)


@pytest.mark.slow
def test_feature_cost_task_counts_what_features_add(small_config, tmp_path):
  c = small_config
  c.output_dir = str(tmp_path)
  record = feature_cost.run(c)
  runs = {(r["mode"], r["features"]): r for r in record["runs"]}
  assert set(runs) == {("ar", "none")} | {("draft_model", f) for f in ("none", "final", "3 layers")}
  none, final = runs["draft_model", "none"], runs["draft_model", "final"]
  assert none["gbytes"] < final["gbytes"] and none["hlo_ops"] < final["hlo_ops"]
  assert none["tokens"] == final["tokens"] and none["tau"] == final["tau"]


def test_report_fills_the_readme_block_from_json(tmp_path):
  folder = tmp_path / "exp"
  (folder / "results").mkdir(parents=True)
  (folder / "results" / "r.json").write_text('{"rows": [{"a": 1, "b": 0.5}]}')
  (folder / "config.py").write_text("def report(d):\n  return 'not here'\n")  # configs: no reports
  (folder / "report.py").write_text(
    "import json\n"
    "from specjax import results\n"
    "def report(d):\n"
    "  rows = json.loads((d / 'r.json').read_text())['rows']\n"
    "  return results.markdown_table(rows, ('a', 'b'))\n"
  )
  (folder / "README.md").write_text("# exp\n\n<!-- results -->\nold\n<!-- /results -->\n\nend\n")
  report.render(folder)
  text = (folder / "README.md").read_text()
  assert "| a | b |" in text and "| 1 | 0.5 |" in text and "old" not in text
  assert text.startswith("# exp") and text.endswith("end\n")
  # A folder that is missing, empty or a file: one error line (as the CLI prints it).
  (tmp_path / "empty").mkdir()
  cases = {
    tmp_path / "nowhere": "nowhere does not exist: pass an experiment folder",
    tmp_path / "empty": "empty has no report.py: pass an experiment folder",
    folder / "README.md": "README.md is a file: pass its experiment folder",
  }
  for path, message in cases.items():
    with pytest.raises(SystemExit) as e:
      report.main([str(path)])
    line = str(e.value.code)
    assert line.startswith("error: ") and message in line and "\n" not in line, line


EXPERIMENT_VARIANTS = {
  "attention_window": [None],
  "feature_cost": [None],
  "training_free": ["b1", "b4"],
  "medusa_smollm2": [
    *(None, "self_distilled", "requests", "tree", "benchmark"),
    *medusa_smollm2.SWEEPS,
  ],
  "medusa_qwen_coder": [None],
  "eagle_qwen_coder": [None, "eagle3"],
  "eagle_smollm2": [
    *(None, "tasks", "volume", "requests", "broad", "more", "wide", "eagle1_300", "ttt_300"),
    *eagle_smollm2.SCALE_RUNS,
    eagle_smollm2.LONG_RUN,
    "eagle3",
    *("sweep_b1", "sweep_b4"),
    "sweep_t1",
    *eagle_smollm2.ABLATIONS,
    *("eagle3_serve", "sweep_eagle3_serve"),
  ],
  "block_smollm2": [None, "sweep_requests", "sweep_peagle", "dspark", "sweep_dspark"],
  "acceptance_losses": ["soft_ce", "tv", "lk", "hass", "hass_r3"],
  "cost_model": [None, "qwen", "smollm2_eagle", "smollm2_blocks"],
  "temperature_sweep": [None],
  "summary": ["smollm2", "qwen"],
}


@pytest.mark.usefixtures("_source_tree_kept")
@pytest.mark.parametrize(
  "name, arg", [(n, a) for n, args in EXPERIMENT_VARIANTS.items() for a in args]
)
def test_experiment_configs_pass_their_checks(name, arg):
  """Every experiment's config (each variant) passes the checks run before anything loads,
  including its sweep variants and the saved Medusa heads it points at."""
  import importlib

  module = importlib.import_module(f"experiments.{name}.config")
  c = module.get_config() if arg is None else module.get_config(arg)
  configs = [c]
  if c.task in ("sweep", "cost_model"):
    configs += [sweep.variant_config(c, dict(o)) for o in c.sweep.variants.values()]
  for v in configs:
    build.check(v)
  if c.task == "train":
    from specjax.tasks import train
    from specjax.train import corpora, data

    # Self-distilled data is not in git: missing or unfinished, one error naming the fix.
    made = [s for s in c.data.sources if s not in corpora.CORPORA]
    generated = [s for s in made if not (Path(s) / data.MANIFEST).exists()]
    drafter = c.objective.get(c.objective.name)  # a run continued from another run's workdir
    init_from = drafter.get("init_from", "") if drafter is not None else ""
    missing_run = False  # workdirs are not in git either
    if init_from:  # "<experiment>:<variant>" names that run's output, as training resolves it
      from specjax.train import objectives

      try:
        missing_run = not Path(objectives.run_output(init_from, "init_from")).is_dir()
      except ValueError:  # a run not trained here
        missing_run = True
    if missing_run:
      with pytest.raises(ValueError, match="init_from"):
        train.plan(c)
    elif generated:
      with pytest.raises(ValueError, match=f"{generated[0]}.*self_distill task"):
        train.plan(c)
    else:
      train.plan(c)


def _parse_in_process(monkeypatch, *args, fails=True):
  """``run.parse_flags`` as the CLI calls it (it reads sys.argv), in this process: the error
  line it exits with (or, with ``fails=False``, the config). The override flags it defines are
  removed again, so the next call can define them afresh."""
  from absl import flags

  from specjax import run

  argv = ["specjax.run", *args]
  monkeypatch.setattr(sys, "argv", argv)
  try:
    if not fails:
      run.parse_flags(argv)
      return run._CONFIG.value
    with pytest.raises(SystemExit) as e:
      run.parse_flags(argv)
  finally:
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:
      delattr(flags.FLAGS, name)
  return str(e.value.code)


def test_cli_value_of_the_wrong_type_names_field_type_and_value(monkeypatch):
  """An override whose value does not parse as the field's type is one line naming the field,
  its type and the value given (it was two chained absl tracebacks)."""
  cases = [
    (("--config=configs/tiny.py", "--config.top_k=1.5"),
     "--config.top_k=1.5: config.top_k is an int (the config file gives 0); '1.5' is not one"),
    (("--config=configs/tiny.py", "--config.max_new_tokens=abc"),
     "config.max_new_tokens is an int (the config file gives 64); 'abc' is not one"),
    (("--config=configs/tiny.py", "--config.temperature=hot"),
     "config.temperature is a float (the config file gives 0.0); 'hot' is not one"),
    (("--config=experiments/cost_model/config.py", "--config.sweep.variants=()"),
     "config.sweep.variants is a dict (a config section); '()' is not one"),
  ]  # fmt: skip
  for args, message in cases:
    line = _parse_in_process(monkeypatch, *args)
    assert line.startswith("error: ") and message in line and "\n" not in line, (args, line)


def test_task_errors_are_one_line(monkeypatch):
  """Bad input (ValueError) and training that turned non-finite (FloatingPointError) end the
  CLI with one error line; SPECJAX_TRACEBACK=1 re-raises."""
  from specjax import run

  monkeypatch.delenv("SPECJAX_TRACEBACK", raising=False)
  for error in (ValueError("config.x is bad"), FloatingPointError("training stopped: loss = nan")):

    def fail(config, error=error):
      raise error

    with pytest.raises(SystemExit) as e:
      run.run_task(types.SimpleNamespace(run=fail), None)
    assert str(e.value.code).splitlines()[0] == f"error: {error}"
    monkeypatch.setenv("SPECJAX_TRACEBACK", "1")
    with pytest.raises(type(error)):
      run.run_task(types.SimpleNamespace(run=fail), None)
    monkeypatch.delenv("SPECJAX_TRACEBACK")


def test_auto_from_that_is_not_a_cost_model_is_named(small_config, tmp_path):
  """``auto_from`` holding garbage, or JSON that is not a cost_model.json: one error naming
  the field and the file, at the config check."""
  (tmp_path / "garbage.json").write_text("{not json")
  (tmp_path / "other.json").write_text('{"rows": []}')
  for name, knob in (("prompt_lookup", "num_draft"), ("draft_model", "num_draft")):
    for file, message in (
      ("garbage.json", r"garbage.json' is not valid JSON \(Expecting property name"),
      ("other.json", r"other.json' is not a cost_model.json \(it has no config, target\)"),
    ):
      c = small_config.copy_and_resolve_references()
      c.drafter.name = name
      del c.drafter[name][knob]  # an int field: "auto" replaces it (the CLI's type is the file's)
      c.drafter[name][knob] = "auto"
      c.drafter[name].auto_from = str(tmp_path / file)
      with pytest.raises(ValueError, match=rf"config.drafter.{name}.auto_from='.*{message}"):
        build.check(c)


def test_top_k_above_the_vocabulary_is_noted_as_clipped(small_config, capsys):
  small_config.top_k = 100  # the vocabulary has 64 tokens
  build.check(small_config)
  build.check(small_config)  # said once
  err = capsys.readouterr().err
  assert err.count("note: config.top_k=100 is more than the target's vocabulary (64 tokens): it "
                   "is clipped to 64") == 1  # fmt: skip


def test_demo_output_is_named_after_the_drafter(monkeypatch):
  """The README's demo commands with another drafter.name each keep their own benchmark.json."""
  for name in ("eagle", "medusa"):
    c = _parse_in_process(monkeypatch, "--config=configs/demo.py", f"--config.drafter.name={name}",
                          fails=False)  # fmt: skip
    assert c.output_dir == f"results/demo/{name}"
  c = _parse_in_process(monkeypatch, "--config=configs/demo.py", fails=False)
  assert c.output_dir == "results/demo/prompt_lookup"
  c = _parse_in_process(monkeypatch, "--config=configs/demo.py", "--config.output_dir=/tmp/x",
                        "--config.drafter.name=eagle", fails=False)  # fmt: skip
  assert c.output_dir == "/tmp/x" and c.drafter.name == "eagle"


def test_the_backend_probe_is_not_printed():
  """No "Unable to initialize backend 'tpu'" line at the top of every run; warnings still show."""
  import logging

  from specjax import run

  run.quiet_backend_probe()
  probe = logging.getLogger("jax._src.xla_bridge")
  assert not probe.isEnabledFor(logging.INFO) and probe.isEnabledFor(logging.WARNING)


def test_timed_sizes_are_checked_before_anything_is_timed(small_config, tmp_path, monkeypatch):
  """task=verify_cost and task=device_bench: verify sizes are increasing token counts from 1
  (before, (0, 2) printed 2 tokens as 45.8x "one" token, exit 0, and (1, -4) was a TypeError
  after the timing), batch sizes >= 1 (device_bench's (2, 0) ran a benchmark first, then named
  config.batch_size), and verify_cost's output directory is checked too (a file there was a
  FileExistsError after the timing); each before the target loads."""
  from configs import device_bench as device_bench_config
  from specjax.tasks import device_bench

  monkeypatch.setattr(build, "target", lambda config: 1 / 0)  # nothing may load
  c = small_config
  c.update(task="verify_cost", output_dir=str(tmp_path))
  c.sweep = config_dict.ConfigDict({"verify_sizes": (1, 4)})
  for sizes in ((0, 2), (1, -4), (4, 1), ()):
    c.sweep.verify_sizes = sizes
    with pytest.raises(ValueError, match=r"config.sweep.verify_sizes=.* in increasing order from"):
      sweep.run_verify_cost(c)
  c.sweep.verify_sizes = (1, 4)
  (tmp_path / "a_file").write_text("")
  c.output_dir = str(tmp_path / "a_file")
  with pytest.raises(ValueError, match=r"config.output_dir=.*a_file' is a file"):
    sweep.run_verify_cost(c)
  d = device_bench_config.get_config("tiny")
  d.output_dir = str(tmp_path / "bench")
  d.device_bench.batch_sizes = (2, 0)
  with pytest.raises(ValueError, match=r"config.device_bench.batch_sizes=\(2, 0\) must list"):
    device_bench.run(d)
  d.device_bench.batch_sizes = (2,)
  d.device_bench.verify_sizes = (1, -4)
  with pytest.raises(ValueError, match=r"config.device_bench.verify_sizes=\(1, -4\) must list"):
    device_bench.run(d)


def _sweep_record(c, runs_of=("ar", "lookup"), dtype="float32"):
  """A finished sweep.json of ``c`` (two categories), written by hand: no model runs."""
  rows = [
    {"temperature": 0.0, "batch": 1, "category": cat, "variant": v, "tau": 1.0 + i,
     "target_calls_per_token": 1.0, "tokens_per_s": 10.0 * (1 + i), "speedup": 1.0 + i,
     "identical": True, "steady_s": 1.0, "target_calls": 10, "tokens": 10}
    for cat in c.sweep.categories for i, v in enumerate(runs_of)
  ]  # fmt: skip
  record = {"config": c.to_dict(), "machine": {}, "runs": rows, "summary": sweep._summary(rows)}
  record["dtype"] = {"dtype": dtype, "how": "config.dtype", "ratios": {}}
  return record


@pytest.fixture
def resumed_sweep(small_config, tmp_path, monkeypatch):
  c = small_config
  c.update(output_dir=str(tmp_path), temperature=0.0, dtype="auto")
  c.sweep = sweep.default_config()
  c.sweep.categories = {"a": ((1, 2, 3),), "b": ((5, 6, 7),)}
  c.sweep.variants = {"lookup": {"name": "prompt_lookup"}}
  c.sweep.resume = True
  monkeypatch.setenv("SPECJAX_CPU_DTYPE", "float32")
  monkeypatch.setattr(build, "target", lambda config: pytest.fail("loaded a model"))
  return c


def test_sweep_resume_measures_a_job_whose_row_is_missing_again(resumed_sweep, tmp_path, capsys):
  """A job with a row deleted from sweep.json is not done: it is measured again whole (its
  speedups are ratios within it); a complete file's summary is computed from its rows."""
  c = resumed_sweep
  record = _sweep_record(c)
  record["runs"] = [r for r in record["runs"] if (r["category"], r["variant"]) != ("b", "lookup")]
  (tmp_path / "sweep.json").write_text(json.dumps(record))
  kept = sweep._resumed(c)
  assert list(kept["jobs"]) == [(0.0, 1, "a")] and not sweep._nothing_left(c, kept)
  record = _sweep_record(c)
  record["summary"] = [{"temperature": 0.0, "batch": 1, "variant": "lookup", "mean_speedup": 9.0,
                        "mean_tau": 9.0}]  # fmt: skip
  (tmp_path / "sweep.json").write_text(json.dumps(record))
  again = sweep.run(c)
  assert again["summary"] == sweep._summary(record["runs"])
  assert "9.000" not in capsys.readouterr().out


def test_sweep_resume_refuses_rows_of_another_resolved_dtype(resumed_sweep, tmp_path, monkeypatch):
  """dtype auto chose float32 for the kept rows; now it chooses bfloat16: mixing them is
  refused before any model loads, naming both."""
  c = resumed_sweep
  (tmp_path / "sweep.json").write_text(json.dumps(_sweep_record(c, dtype="float32")))
  monkeypatch.setenv("SPECJAX_CPU_DTYPE", "bfloat16")
  with pytest.raises(ValueError, match=r"sweep.resume: .*config.dtype \(auto chose float32 then, "
                     r"bfloat16 now\)"):  # fmt: skip
    sweep.run(c)


def test_cost_model_reuse_sweep_is_checked_before_the_target_loads(resumed_sweep, tmp_path):
  """A truncated sweep.json, or one lacking a category's AR row: one error naming the field
  and the file, before any model loads; an AR step timed otherwise now is a ValueError."""
  from specjax.tasks import cost_model

  c = resumed_sweep
  c.sweep.resume = False
  path = tmp_path / "reused.json"
  c.cost_model = config_dict.ConfigDict({"chips": (), "context": 8, "max_k": 2, "repeats": 1,
                                         "reuse_sweep": str(path)})  # fmt: skip
  path.write_text('{"config": {"a": 1,\n')
  with pytest.raises(ValueError, match=r"reuse_sweep: .*reused.json is not valid JSON"):
    cost_model.run(c)
  record = _sweep_record(c)
  record["runs"] = [r for r in record["runs"] if (r["category"], r["variant"]) != ("b", "ar")]
  path.write_text(json.dumps(record))
  with pytest.raises(ValueError, match=r"reuse_sweep=.*reused.json' has no 'ar' row of 'b'"):
    cost_model.run(c)
  with pytest.raises(ValueError, match=r"reuse_sweep: an AR step takes"):
    cost_model._check_same_speed(_sweep_record(c), now=0.5)


@pytest.mark.parametrize(
  "text,message",
  [('{"columns": {', r"results/specbench.json is not valid JSON \(Expecting"),
   ("{}", r"report.py could not read .*results: KeyError 'columns'")],
)  # fmt: skip
def test_report_over_a_damaged_results_file_is_one_error(tmp_path, text, message):
  folder = tmp_path / "exp"
  (folder / "results").mkdir(parents=True)
  (folder / "results" / "specbench.json").write_text(text)
  (folder / "report.py").write_text(
    "import json\n"
    "def report(d):\n"
    "  return json.loads((d / 'specbench.json').read_text())['columns']\n"
  )
  (folder / "README.md").write_text("# exp\n\n<!-- results -->\nold\n<!-- /results -->\n")
  with pytest.raises(SystemExit) as e:
    report.main([str(folder)])
  line = str(e.value.code)
  assert line.startswith("error: ") and "\n" not in line, line
  assert re.search(message, line), line
  assert "old" in (folder / "README.md").read_text()
