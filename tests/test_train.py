"""The distillation loss, the train step and loop, checkpoints (kill -9, resume), the train task."""

import dataclasses
import json
import os
import signal
import struct
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import train_worker

from configs import train_tiny
from specjax import build, losses, metrics, parallel
from specjax.decode import generate
from specjax.models import checkpoint as model_checkpoint
from specjax.models import export, tiny
from specjax.tasks import train as train_task
from specjax.train import checkpoint, data, loop, metrics_log, objectives, step

# -- the loss ---------------------------------------------------------------------------------


def _kl_numpy(t, s, temperature):
  p = np.exp(t / temperature) / np.exp(t / temperature).sum(-1, keepdims=True)
  q = np.exp(s / temperature) / np.exp(s / temperature).sum(-1, keepdims=True)
  return (p * (np.log(p) - np.log(q))).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_distill_kl_is_masked_mean_of_forward_kl(temperature):
  rng = np.random.default_rng(0)
  t, s = rng.normal(size=(2, 2, 5, 7)) * 2
  mask = np.array([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], np.float32)
  loss, m = losses.distill_kl(jnp.asarray(t), jnp.asarray(s), jnp.asarray(mask), temperature)
  kl = _kl_numpy(t, s, temperature)
  np.testing.assert_allclose(loss, (kl * mask).sum() / mask.sum() * temperature**2, rtol=1e-5)
  p1, q1 = (np.exp(x) / np.exp(x).sum(-1, keepdims=True) for x in (t, s))
  accept = np.minimum(p1, q1).sum(-1)  # 1 - total variation
  np.testing.assert_allclose(m["accept"], (accept * mask).sum() / mask.sum(), rtol=1e-5)
  # Positions with mask 0 do not count, whatever the student says there.
  s2 = np.where(mask[..., None] == 0, rng.normal(size=s.shape) * 9, s)
  loss2, _ = losses.distill_kl(jnp.asarray(t), jnp.asarray(s2), jnp.asarray(mask), temperature)
  np.testing.assert_allclose(loss2, loss, rtol=1e-6)


def test_distill_kl_is_zero_only_at_the_teacher():
  t = jax.random.normal(jax.random.key(0), (2, 4, 9))
  mask = jnp.ones((2, 4))
  loss, m = losses.distill_kl(t, t, mask)
  assert abs(float(loss)) < 1e-6 and float(m["accept"]) == pytest.approx(1.0, abs=1e-6)
  assert float(m["top1"]) == 1.0
  loss, _ = losses.distill_kl(t, t + jax.random.normal(jax.random.key(1), t.shape), mask)
  assert float(loss) > 0.01


# -- the objective and the step ---------------------------------------------------------------


def test_objective_rejects_mismatched_draft():
  tcfg = tiny.tiny_config(vocab_size=64, dim=32)
  with pytest.raises(ValueError, match="vocab_size"):
    objectives.DraftDistill(tcfg, tiny.tiny_config(vocab_size=32, dim=32))
  with pytest.raises(ValueError, match="draft.dim must be 32"):
    objectives.DraftDistill(tcfg, tiny.tiny_config(vocab_size=64, dim=16), embed="copy")
  objectives.DraftDistill(tcfg, tiny.tiny_config(vocab_size=64, dim=16), embed="random")


_TOY_EXPERIMENT = """
from ml_collections import config_dict


def get_config(arg=None):
  if arg not in ("first", "sweep"):
    raise ValueError(f"unknown variant {arg!r} of toy/config.py; choose first, sweep.")
  return config_dict.ConfigDict({"task": "train" if arg == "first" else "sweep",
                                 "workdir": "runs/first"})
"""


def test_init_from_names_a_run_and_resolves_to_its_output(tmp_path, monkeypatch):
  """``init_from = "<experiment>:<variant>"`` is that variant's ``workdir/draft_final``,
  replaced in the config by ``objectives.check`` before the objective's own check; a path
  passes as it is; a run not trained yet, a variant that does not train, an unknown variant or
  experiment are each one error naming the field."""
  (tmp_path / "experiments" / "toy").mkdir(parents=True)
  (tmp_path / "experiments" / "toy" / "config.py").write_text(_TOY_EXPERIMENT)
  monkeypatch.chdir(tmp_path)
  field = "config.objective.eagle.init_from"
  with pytest.raises(ValueError, match=r"draft_final, which does not exist yet: train it first"):
    objectives.run_output("toy:first", field)
  (tmp_path / "runs" / "first" / "draft_final").mkdir(parents=True)
  assert objectives.run_output("toy:first", field) == "runs/first/draft_final"
  assert objectives.run_output("elsewhere/draft_final", field) == "elsewhere/draft_final"
  for ref, error in [
    ("toy:sweep", "is not a training run"), ("toy:third", "unknown variant 'third'"),
    ("other:first", "names no run"),
  ]:  # fmt: skip
    with pytest.raises(ValueError, match=f"{field}='{ref}'.*{error}"):
      objectives.run_output(ref, field)
  c = train_tiny.get_config()
  c.objective = objectives.default_config("eagle")
  c.objective.eagle.init_from = "toy:first"
  with pytest.raises(ValueError, match="init_from='runs/first/draft_final' holds no eagle.json"):
    objectives.check(c)  # resolved first, then checked as a path


def test_frozen_embedding_is_not_trained():
  objective, tparams, _ = train_worker.setup()
  frozen = dataclasses.replace(objective, embed="frozen")
  params = frozen.init(jax.random.key(0), tparams)
  assert "embed" not in params and "lm_head" not in params
  full = frozen.model_params(params, tparams)
  assert full["embed"] is tparams["embed"] and full["lm_head"] is tparams["lm_head"]


def test_train_step_lowers_loss_and_compiles_once():
  objective, tparams, ds = train_worker.setup()
  mesh = parallel.make_mesh(parallel.MeshConfig())
  steps = step.compile_steps(objective, train_worker.OPTIM, mesh, tparams, seed=0)
  frozen = parallel.put_global(tparams, steps.frozen_shardings)
  state = steps.init(frozen)
  before = jax.device_get(state.params["layers"][0]["wq"])
  losses_ = []
  for i in range(12):
    batch = parallel.host_batch_to_global(ds.batch(i, 8), mesh, 8)
    state, m = steps.train(state, frozen, batch)
    losses_.append(float(m["loss"]))
  assert steps.train._cache_size() == 1  # one compile for every step
  assert int(state.step) == 12
  assert np.mean(losses_[-3:]) < 0.7 * np.mean(losses_[:3]), losses_
  assert not np.allclose(before, state.params["layers"][0]["wq"])


@pytest.mark.parametrize("name", ["tv", "lk", "rkl", "jsd"])
def test_each_token_loss_trains_towards_acceptance(name):
  """The draft trained by another of the token losses: its loss falls and the acceptance
  probability of one drafted token (the ``accept`` metric, the same under every loss) rises."""
  objective, tparams, ds = train_worker.setup()
  objective = dataclasses.replace(objective, token_loss=name)
  mesh = parallel.make_mesh(parallel.MeshConfig())
  steps = step.compile_steps(objective, train_worker.OPTIM, mesh, tparams, seed=0)
  frozen = parallel.put_global(tparams, steps.frozen_shardings)
  state, seen = steps.init(frozen), []
  for i in range(12):
    batch = parallel.host_batch_to_global(ds.batch(i, 8), mesh, 8)
    state, m = steps.train(state, frozen, batch)
    seen.append((float(m["loss"]), float(m["accept"])))
  (loss0, accept0), (loss1, accept1) = np.mean(seen[:3], 0), np.mean(seen[-3:], 0)
  assert loss1 < loss0 and accept1 > accept0 + 0.05, seen


# -- checkpoints and resume -------------------------------------------------------------------


def _loop_cfg(workdir, steps, **kw):
  kw = {"global_batch": 8, "log_every": 1, "progress": False, "async_checkpoint": False} | kw
  return loop.LoopConfig(steps=steps, workdir=str(workdir), **kw)


def test_resume_continues_exactly(tmp_path, capsys):
  """In-process: 6 steps straight vs 3 steps, then a new call that resumes to 6 (and says so)."""
  objective, tparams, ds = train_worker.setup()
  mesh = parallel.make_mesh(parallel.MeshConfig())
  run = lambda workdir, steps: loop.train(
    objective, tparams, ds, None, _loop_cfg(workdir, steps), train_worker.OPTIM, mesh
  )
  full, first, rest = run(tmp_path / "a", 6), run(tmp_path / "b", 3), run(tmp_path / "b", 6)
  assert first.start_step == 0 and rest.start_step == 3
  assert capsys.readouterr().out.count("resumed from step 3 of 6") == 1
  loss = lambda history: [r["loss"] for r in history]
  assert loss(first.history + rest.history) == loss(full.history)
  b = metrics_log.read(tmp_path / "b" / "metrics.jsonl")
  assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6] and loss(b) == loss(full.history)
  same = jax.tree.map(np.array_equal, jax.device_get(full.state), jax.device_get(rest.state))
  assert all(jax.tree.leaves(same))  # params, optimiser state, rng and step


def test_resume_refuses_another_target_global_batch_or_rows(tmp_path):
  """A run resumed with another target's weights (its fingerprint, task=train's ``setup``),
  another global batch or other training rows (data made again, e.g. by the target in another
  dtype: one token changed) is refused naming both values, as is ``resume = False`` over the
  checkpoints (a fresh run there would save none); the same setup resumes."""
  objective, tparams, ds = train_worker.setup()
  mesh = parallel.make_mesh(parallel.MeshConfig())
  tokens = ds.tokens.copy()
  tokens[3, 5] = (tokens[3, 5] + 1) % 64  # the tiny vocabulary
  other_rows = data.Dataset(tokens, ds.mask)

  def run(steps, setup, rows=ds, **kw):
    cfg = _loop_cfg(tmp_path, steps, **kw)
    return loop.train(objective, tparams, rows, None, cfg, train_worker.OPTIM, mesh, setup=setup)

  run(2, {"target": "aaaa"})
  with pytest.raises(ValueError, match="target: checkpoint 'aaaa' vs now 'bbbb'"):
    run(3, {"target": "bbbb"})
  with pytest.raises(ValueError, match="global_batch: checkpoint 8 vs now 4"):
    run(3, {"target": "aaaa"}, global_batch=4)
  with pytest.raises(ValueError, match=f"rows: checkpoint '{ds.fingerprint()}' vs now '"):
    run(3, {"target": "aaaa"}, rows=other_rows)
  with pytest.raises(ValueError, match=r"resume=False, but .* \(the newest at step 2\): a run"):
    run(3, {"target": "aaaa"}, resume=False)
  assert run(3, {"target": "aaaa"}).start_step == 2


def test_non_finite_loss_stops_the_run_naming_the_step(tmp_path):
  """NaN injected into the loss (a poisoned row): the run stops at the first step whose batch
  holds it, names that step, keeps the checkpoint before it, saves nothing after, and logs
  only valid JSON."""
  objective, tparams, ds = train_worker.setup()
  mask = ds.mask.copy()
  mask[5] = np.nan
  poisoned = data.Dataset(ds.tokens, mask)
  bad_step = next(s + 1 for s in range(100) if np.isnan(poisoned.batch(s, 8)["mask"]).any())
  mesh = parallel.make_mesh(parallel.MeshConfig())
  cfg = _loop_cfg(tmp_path, bad_step + 3, checkpoint_every=1)
  with pytest.raises(FloatingPointError, match=f"loss = nan at step {bad_step}\\."):
    loop.train(objective, tparams, poisoned, None, cfg, train_worker.OPTIM, mesh)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
  assert [r["step"] for r in records] == list(range(1, bad_step))
  assert checkpoint.Checkpointer(tmp_path / "checkpoints").latest_step() == bad_step - 1


@pytest.mark.parametrize("damage", ["zeroed block", "truncated", "bad metadata"])
def test_damaged_checkpoint_is_one_clear_error(tmp_path, damage):
  """A saved array file with a zeroed block, cut short, or unreadable metadata: restoring
  names the checkpoint and the fix in one line, instead of training on from garbage."""
  objective, tparams, ds = train_worker.setup()
  mesh = parallel.make_mesh(parallel.MeshConfig())
  loop.train(objective, tparams, ds, None, _loop_cfg(tmp_path, 2), train_worker.OPTIM, mesh)
  state_dir = tmp_path / "checkpoints" / "2" / "state"
  files = sorted((p for p in state_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  if damage == "bad metadata":
    target = next(p for p in files if p.name.endswith("_METADATA") or p.name == "manifest.ocdbt")
    target.write_text("{not json")
  else:
    target = files[-1]  # the largest file: array data
    raw = bytearray(target.read_bytes())
    if damage == "truncated":
      raw = raw[: len(raw) // 2]
    else:
      raw[len(raw) // 4 : len(raw) // 4 + 4096] = bytes(min(4096, len(raw) - len(raw) // 4))
    target.write_bytes(bytes(raw))
  with pytest.raises(ValueError, match=r"checkpoint .*checkpoints/2.* (damaged|cannot be read)"):
    loop.train(objective, tparams, ds, None, _loop_cfg(tmp_path, 4), train_worker.OPTIM, mesh)


def test_a_second_run_on_a_workdir_in_use_is_refused(tmp_path, monkeypatch):
  """The workdir lock: refused while held (naming the holder's pid and config.workdir), by the
  train task before the target loads; free once released."""
  busy = f"config.workdir='{tmp_path}' is in use by another training run \\(pid {os.getpid()}"
  with loop.workdir_lock(tmp_path), pytest.raises(ValueError, match=busy):  # noqa: SIM117
    with loop.workdir_lock(tmp_path):
      pass
  c = train_tiny.get_config()
  c.workdir = str(tmp_path)
  monkeypatch.setattr(train_task.source, "load", lambda c: pytest.fail("the target loaded"))
  with loop.workdir_lock(tmp_path), pytest.raises(ValueError, match=busy):
    train_task.run(c)
  with loop.workdir_lock(tmp_path):
    pass


def test_checkpoint_from_another_model_shape_names_the_leaf(tmp_path):
  objective, tparams, ds = train_worker.setup()
  mesh = parallel.make_mesh(parallel.MeshConfig())
  loop.train(objective, tparams, ds, None, _loop_cfg(tmp_path, 1), train_worker.OPTIM, mesh)
  narrower = dataclasses.replace(objective.draft_cfg, ffn_dim=48)
  deeper = dataclasses.replace(objective.draft_cfg, num_layers=2)
  for draft_cfg, message in (
    (narrower, r"leaf 'params/layers/0/w_down' is float32\[32, 64\] there"),
    (deeper, r"has no leaf 'params/layers/1/attn_norm'"),
  ):
    changed = dataclasses.replace(objective, draft_cfg=draft_cfg)
    with pytest.raises(ValueError, match=message):
      loop.train(changed, tparams, ds, None, _loop_cfg(tmp_path, 2), train_worker.OPTIM, mesh)


def test_metrics_log_drops_records_after_the_resume_step(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps({"step": s, "loss": s}) + "\n" for s in range(1, 6)) + '{"st')
  log = metrics_log.MetricsLog(path, resume_step=3)
  log.write({"step": 4, "loss": 40})
  log.close()
  assert metrics_log.read(path) == [{"step": s, "loss": s} for s in (1, 2, 3)] + [
    {"step": 4, "loss": 40}
  ]


def _events(directory):
  """Every event of the TensorBoard files in ``directory`` (TFRecord framing: length, its CRC,
  the serialized Event, its CRC), read with tensorboardX's own Event proto."""
  from tensorboardX.proto import event_pb2

  events = []
  for path in sorted(directory.glob("events.out.tfevents.*")):
    data, i = path.read_bytes(), 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i : i + 8])
      events.append(event_pb2.Event.FromString(data[i + 12 : i + 12 + n]))
      i += 12 + n + 4
  return events


def test_tensorboard_gets_the_records_scalars_and_a_resume_purges(tmp_path):
  """The workdir's tensorboard/ holds every numeric field of metrics.jsonl at its step
  (``train/loss``, ...); a resumed run marks its first new step, from which TensorBoard drops
  the earlier run's events."""
  objective, tparams, ds = train_worker.setup()
  mesh = parallel.make_mesh(parallel.MeshConfig())
  cfg = dict(eval_every=2)
  loop.train(objective, tparams, ds, ds, _loop_cfg(tmp_path, 3, **cfg), train_worker.OPTIM, mesh)
  loop.train(objective, tparams, ds, ds, _loop_cfg(tmp_path, 5, **cfg), train_worker.OPTIM, mesh)
  scalars = {
    (v.tag, e.step): v.simple_value for e in _events(tmp_path / "tensorboard")
    for v in e.summary.value
  }  # fmt: skip
  records = metrics_log.read(tmp_path / "metrics.jsonl")
  trained = [r for r in records if "loss" in r]
  assert [r["step"] for r in trained] == [1, 2, 3, 4, 5]
  for r in trained:
    for name in ("loss", "accept", "top1", "tokens_per_s"):
      assert scalars[(f"train/{name}", r["step"])] == pytest.approx(r[name], rel=1e-6)
  evaluated = [r for r in records if "eval/loss" in r]
  assert [r["step"] for r in evaluated] == [2, 3, 4, 5]
  for r in evaluated:
    assert scalars[("eval/loss", r["step"])] == pytest.approx(r["eval/loss"], rel=1e-6)
  purges = [e.step for e in _events(tmp_path / "tensorboard") if e.session_log.status == 1]
  assert purges == [4]


_SAVE_THEN_DIE = """
import os, pathlib, signal, sys, time
import jax, jax.numpy as jnp
from specjax.train import checkpoint, step
from specjax.models import tiny
ckpt = checkpoint.Checkpointer(sys.argv[1], keep=3)
state = lambda s: step.TrainState(jnp.int32(s), {"w": jnp.full((2048, 2048), float(s))}, (),
                                  jnp.zeros(2, jnp.uint32))
ckpt.save(1, state(1), {"signature": {}})
ckpt.wait()
ckpt.save(2, state(2), {"signature": {}})  # async: returns while the files are being written
# Orbax may create the step's temporary directory on its background thread too: kill once it
# is there (the save is then under way), not before it exists.
partial, deadline = pathlib.Path(sys.argv[1]) / "2.orbax-checkpoint-tmp", time.time() + 60
while not partial.is_dir() and time.time() < deadline:
  time.sleep(0.001)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.multiprocess
def test_kill_mid_save_leaves_no_valid_partial_checkpoint(tmp_path):
  proc = subprocess.run(
    [sys.executable, "-c", _SAVE_THEN_DIE, str(tmp_path)],
    env=train_worker.env(),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  assert (tmp_path / "2.orbax-checkpoint-tmp").is_dir()  # killed mid-save
  assert not (tmp_path / "2").exists()
  ckpt = checkpoint.Checkpointer(tmp_path)
  assert ckpt.latest_step() == 1 and ckpt.all_steps() == [1]
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = step.TrainState(
    jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding),
    {"w": jax.ShapeDtypeStruct((2048, 2048), jnp.float32, sharding=sharding)},
    (),
    jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding),
  )
  restored = ckpt.restore(1, abstract, signature={})
  assert int(restored.step) == 1 and float(restored.params["w"][5, 7]) == 1.0
  ckpt.save(2, dataclasses.replace(restored, step=jnp.int32(2)), {"signature": {}})
  ckpt.wait()  # the interrupted step saves cleanly over the leftover
  assert ckpt.all_steps() == [1, 2] and not (tmp_path / "2.orbax-checkpoint-tmp").exists()
  ckpt.close()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_kill_9_mid_run_then_resume_gives_the_same_curve(tmp_path):
  args = {"layouts": {"run": {}}, "steps": 40, "checkpoint_every": 5}
  straight = train_worker.run_subprocess(args | {"workdir": str(tmp_path / "a")})
  metrics = tmp_path / "b" / "run" / "metrics.jsonl"
  proc = subprocess.Popen(
    train_worker.command(args | {"workdir": str(tmp_path / "b"), "slow_s": 0.05}),
    env=train_worker.env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 120
  while len(metrics_log.read(metrics)) < 17 and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  os.kill(proc.pid, signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  killed_at = len(metrics_log.read(metrics))
  assert 17 <= killed_at < 40
  resumed = train_worker.run_subprocess(args | {"workdir": str(tmp_path / "b")})
  assert 0 < resumed["run"]["start"] <= killed_at
  want = [r["loss"] for r in metrics_log.read(tmp_path / "a" / "run" / "metrics.jsonl")]
  got = [r["loss"] for r in metrics_log.read(metrics)]
  assert len(want) == 40 and got == want  # step for step, bit for bit
  assert straight["run"]["losses"] == want


# -- bad input, through the train task --------------------------------------------------------


def _tiny_config(tmp_path, **train):
  c = train_tiny.get_config()
  c.workdir = str(tmp_path)
  c.data.max_examples, c.data.eval_examples = 96, 16
  c.train.update(progress=False, eval_batches=1)  # 16 eval rows: one global batch
  c.train.update(**train)
  return c


@pytest.mark.parametrize(
  "override, message",
  [
    ({"mesh.data": 2}, "mesh larger than the devices|larger than the devices"),
    ({"train.global_batch": 0}, "train.global_batch must be >= 1"),
    ({"data.sources": ("no/such/dir",)}, "neither a corpus .* nor an existing"),
    ({"data.seq_len": 1}, "data.seq_len must be >= 2"),
    ({"data.seed": -1}, r"config.data.seed must be an integer in \[0, 2\*\*32\), got -1"),
    ({"distributed.num_processes": 2}, "coordinator_address"),
    ({"objective.draft_distill.embed": "shared"}, "draft_distill.embed='shared' is unknown"),
    ({"objective.draft_distill.loss": "l2"}, "draft_distill.loss='l2' is unknown; choose one"),
    ({"evaluate.tau_every": -1}, "evaluate.tau_every must be an integer >= 0"),
    (
      {"evaluate.tau_every": 2, "evaluate.tau_temperatures": (0.0, -1.0)},
      r"evaluate.tau_temperatures must list finite temperatures >= 0 .* got \(0.0, -1.0\)",
    ),
    (  # failed after the set-up, leaving checkpoints and metrics behind
      {"evaluate.tau_every": 1, "evaluate.tau_temperatures": (float("inf"),)},
      r"evaluate.tau_temperatures must list finite temperatures .* got \(inf,\)",
    ),
    ({"objective.name": "hydra"}, "objective.name='hydra' is unknown"),
    ({"optim.b1": 1.0}, r"optim.b1 must be in \[0, 1\), got 1.0"),  # trained, then NaN
    ({"optim.b2": 2.0}, r"optim.b2 must be in \[0, 1\), got 2.0"),  # trained on silently
    ({"optim.end_lr_fraction": -5.0}, r"optim.end_lr_fraction must be in \[0, 1\]"),  # ascent
    ({"record_to": __file__}, "config.record_to=.* is a file, not a directory"),
    ({"data.eval_examples": 8}, r"eval_examples=8 is fewer than train.global_batch=16: .* >= 16"),
    (  # evaluated the same rows 6 times over, unsaid
      {"train.eval_batches": 6},
      r"config.train.eval_batches=6 global batches of 16 take 96 rows, more than config.data."
      r"eval_examples=16: an evaluation would repeat rows; lower eval_batches \(at most 1\)",
    ),
    (  # was refused by the split, after the target sampled every row
      {"data.eval_examples": 4096},
      r"data.eval_examples=4096 leaves no rows to train on: a random target samples config.data",
    ),
    ({"train.steps": 0}, r"^config.train.steps must be >= 1, got 0"),
    (
      {"train.seed": 2**32},
      r"config.train.seed must be an integer in \[0, 2\*\*32\), got 4294967296",
    ),
    (  # ignored with files, but not a value
      {"data.files": ("x.jsonl",), "data.max_examples": -1},
      r"config.data.max_examples must be an integer >= 0 .*, got -1",
    ),
    # Sizes an objective's rows cannot hold: trained on nothing (loss 0), or a raw JAX error.
    (
      {"objective.name": "dflash", "objective.dflash.block_size": 40},
      r"config.objective.dflash.block_size=40 .* config.data.seq_len=32",
    ),
    (
      {"objective.name": "dflash", "objective.dflash.anchors": 100},
      r"dflash.anchors=100 exceeds the 25 anchor positions .*config.data.seq_len=32",
    ),
    (
      {"objective.name": "medusa", "objective.medusa.num_heads": 40},
      r"config.objective.medusa.num_heads=40 .* config.data.seq_len=32",
    ),
    (
      {"objective.name": "peagle", "objective.peagle.num_depths": 40},
      r"config.objective.peagle.num_depths=40 .* config.data.seq_len=32",
    ),
    (
      {"objective.name": "peagle", "objective.peagle.anchors": 100},
      r"config.objective.peagle.anchors=100 exceeds the 30 anchor pairs .*config.data.seq_len=32",
    ),
    (
      {"objective.name": "eagle", "objective.eagle.rollout": 8, "data.seq_len": 8},
      r"config.objective.eagle.rollout=8 .* config.data.seq_len=8",
    ),
    # Not finite: trained, then "grad_norm = nan ... lower optim.learning_rate".
    ({"optim.weight_decay": float("nan")}, r"config.optim.weight_decay must be .*, got nan"),
    ({"optim.grad_clip": float("nan")}, r"config.optim.grad_clip must be .*, got nan"),
    ({"optim.learning_rate": float("inf")}, r"config.optim.learning_rate must be .*, got inf"),
    (
      {"objective.name": "eagle", "objective.eagle.noise": float("inf")},
      r"config.objective.eagle.noise must be .*, got inf",
    ),
    (
      {"objective.draft_distill.temperature": float("inf")},
      r"config.objective.draft_distill.temperature must be .*, got inf",
    ),
    (
      {"objective.draft_distill.temperature": 0.0},
      r"config.objective.draft_distill.temperature must be .*, got 0.0",
    ),
    (
      {"objective.draft_distill.num_layers": 0},
      r"config.objective.draft_distill.num_layers must be an integer >= 1",
    ),
    (
      {"objective.draft_distill.num_kv_heads": 3},
      r"config.objective.draft_distill.num_heads \(4\) must be a multiple of num_kv_heads \(3\)",
    ),
    # Named as the objective's fields, not the drafter's.
    (
      {"objective.name": "dflash", "objective.dflash.mask_id": -1},
      r"^config.objective.dflash.mask_id=-1",
    ),
    (
      {"objective.name": "peagle", "objective.peagle.num_depths": 0},
      r"^config.objective.peagle.num_depths must be an integer >= 1",
    ),
    (
      {"objective.name": "eagle", "objective.eagle.feature_layers": ()},
      r"^config.objective.eagle.feature_layers is empty: .* e.g. \('final',\)",
    ),
    (
      {"objective.name": "eagle", "objective.eagle.feature_layers": (99,)},
      r"^config.objective.eagle.feature_layers: feature 99 is unknown .* \[0, 4\)",
    ),
  ],
)
def test_train_task_rejects_bad_config(tmp_path, monkeypatch, override, message):
  """Each refused by one error naming the field, before the target loads."""
  monkeypatch.setattr(train_task.source, "load", lambda *a: pytest.fail("the target loaded"))
  c = _tiny_config(tmp_path)
  for key, value in override.items():
    *sections, field = key.split(".")
    node = c
    for section in sections:
      node = node[section]
    node[field] = value
  with pytest.raises(ValueError, match=message):
    train_task.run(c)


def test_a_workdir_holding_other_files_is_refused(tmp_path):
  """A workdir holding the user's own files is refused before anything loads (the run would
  append to a metrics.jsonl of theirs and replace a draft_final); a run's own files and dot
  files (its lock, files being written) are not in the way."""
  (tmp_path / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match=r"holds files a training run does not write \(notes.txt\)"):
    train_task.run(_tiny_config(tmp_path))
  assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
  (tmp_path / "notes.txt").unlink()
  for name in (*train_task.RUN_FILES, ".lock", ".train.json.tmp", "data_state.0.jsonl"):
    (tmp_path / name).mkdir()
  train_task.check_workdir(str(tmp_path))
  (tmp_path / "record" / "v").mkdir(parents=True)  # config.record_to inside the workdir
  train_task.check_workdir(str(tmp_path), str(tmp_path / "record" / "v"))
  with pytest.raises(ValueError, match=r"\(record\)"):
    train_task.check_workdir(str(tmp_path), "")


def test_a_warmup_longer_than_the_run_is_said():
  """optim.warmup_steps past train.steps never reaches the learning rate set (it trained at a
  fraction of it, unsaid): the run says so and what it reaches."""
  c = _tiny_config("")
  c.train.steps, c.optim.warmup_steps = 4, 1000
  note = train_task.warmup_note(train_task.plan(c))
  lr = c.optim.learning_rate
  assert note.startswith("note: config.optim.warmup_steps=1000 is longer than config.train.steps")
  assert f"reaches {lr * 4 / 1000:.3g}, not config.optim.learning_rate={lr}" in note
  c.optim.warmup_steps = 4
  assert train_task.warmup_note(train_task.plan(c)) is None


def test_record_to_never_replaces_another_runs_record_or_the_users_files(tmp_path):
  """``record_to`` receives train.json and metrics.jsonl: another run's workdir (its record
  no longer matched its checkpoints) or files of those names that are not a training record
  (the user's own) were overwritten, exit 0; now each is refused before anything loads,
  untouched, while an earlier run's record there (an experiment's results folder) is replaced."""
  work = str(tmp_path / "work")
  other = tmp_path / "other_run"
  (other / "checkpoints").mkdir(parents=True)
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "train.json").write_text('{"my": "notes"}')
  loose = tmp_path / "loose"
  loose.mkdir()
  (loose / "metrics.jsonl").write_text("mine\n")
  cases = ((other, "another training run's workdir"),
           (mine, "holds a train.json that is not a training run's record"),
           (loose, "holds a metrics.jsonl that is not a training run's record"))  # fmt: skip
  for record_to, message in cases:
    before = {q.name: q.is_dir() or q.read_text() for q in record_to.iterdir()}
    c = _tiny_config(work)
    c.record_to = str(record_to)
    with pytest.raises(ValueError, match=f"config.record_to=.* {message}"):
      train_task.run(c)
    assert {q.name: q.is_dir() or q.read_text() for q in record_to.iterdir()} == before
  (mine / "train.json").write_text('{"config": {}, "train_s": 1.0}')  # an earlier run's record
  (mine / "metrics.jsonl").write_text("{}\n")
  train_task.check_record_to(str(mine), work)
  train_task.check_record_to(work, work)  # the run's own workdir


def test_unfinished_self_distillation_is_rejected(tmp_path):
  (tmp_path / "shards").mkdir()
  c = _tiny_config(tmp_path / "run")
  c.data.sources = (str(tmp_path / "shards"),)
  with pytest.raises(ValueError, match="no manifest.json"):
    train_task.run(c)


def test_batch_larger_than_the_data_is_rejected():
  objective, tparams, ds = train_worker.setup()
  mesh = parallel.make_mesh(parallel.MeshConfig())
  with pytest.raises(ValueError, match="the train set has 64 examples, fewer than"):
    loop.train(
      objective, tparams, ds, None, _loop_cfg("", 1, global_batch=128), train_worker.OPTIM, mesh
    )
  with pytest.raises(ValueError, match="no examples"):
    data.Dataset(np.zeros((0, 8), np.int32), np.zeros((0, 8), np.float32))


# -- export and the end-to-end task -----------------------------------------------------------


def test_export_loads_back_as_a_draft_model(tmp_path):
  cfg, params = tiny.random_model(seed=2, vocab_size=64, dim=32, num_layers=2)
  export.save_model(tmp_path / "draft", cfg, params)
  export.save_model(tmp_path / "draft", cfg, params)  # replacing an export works too
  cfg2, params2 = model_checkpoint.load_safetensors(tmp_path / "draft")
  assert dataclasses.replace(cfg2, name=cfg.name) == cfg
  same = jax.tree.map(np.array_equal, jax.device_get(params), jax.device_get(params2))
  assert all(jax.tree.leaves(same))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]  # no temp dirs left
  # A random target has no tokenizer: the export loads through the config path all the same.
  from specjax.models import source

  model = source.load(source.config(source="safetensors", path=str(tmp_path / "draft")))
  assert model.tokenizer is None and model.cfg.num_layers == 2


def test_weights_with_nan_are_refused_at_load(tmp_path):
  from specjax.models import source

  cfg, params = tiny.random_model(seed=2, vocab_size=64, dim=32, num_layers=2)
  params["layers"][1]["wq"] = params["layers"][1]["wq"].at[0, 0].set(jnp.nan)
  export.save_model(tmp_path / "draft", cfg, params)
  with pytest.raises(ValueError, match="layers/1/wq holds NaN"):
    source.load(source.config(source="safetensors", path=str(tmp_path / "draft")))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_train_cli_distils_a_better_draft(tmp_path):
  """python -m specjax.run --config=configs/train_tiny.py, shortened: tau rises with training."""
  cmd = [sys.executable, "-m", "specjax.run", "--config=configs/train_tiny.py"] + [
    f"--config.{k}={v}"
    for k, v in {
      "workdir": tmp_path,
      "record_to": tmp_path / "record",
      "data.max_examples": 288,
      "data.eval_examples": 32,
      "train.steps": 60,
      "train.eval_every": 30,
      "train.checkpoint_every": 30,
      "train.progress": False,
      "optim.decay_steps": 50,
      "max_new_tokens": 24,
    }.items()
  ]
  proc = subprocess.run(
    cmd, capture_output=True, text=True, env=train_worker.env(), cwd=train_worker.ROOT, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  saved = json.loads((tmp_path / "train.json").read_text())
  records = metrics_log.read(tmp_path / "metrics.jsonl")
  for name in ("train.json", "metrics.jsonl"):  # also where config.record_to says
    assert (tmp_path / "record" / name).read_text() == (tmp_path / name).read_text(), name
  assert [r["step"] for r in records if "eval/kl" in r] == [30, 60]
  train_kl = [r["kl"] for r in records if "kl" in r]
  assert train_kl[-1] < 0.6 * train_kl[0], train_kl
  tau = {k: v["tau"] for k, v in saved["decode"].items()}
  assert tau["final"] > tau["init"] + 0.2, tau
  assert f"draft final: tau {tau['final']:.3f}" in proc.stdout
  for name in ("draft_init", "draft_final"):
    cfg, _ = model_checkpoint.load_safetensors(tmp_path / name)
    assert (cfg.num_layers, cfg.dim) == (1, 64)


@pytest.mark.slow
def test_tau_on_the_curve_is_the_decoded_tau(tmp_path):
  """evaluate.tau_every: the simulator's greedy τ of the draft being trained is on the curve at
  step 0, every tau_every steps and the end (metrics.jsonl and TensorBoard), and at the end it
  is the τ of decoding the same prompts with the trained draft; with temperature 1 among
  ``tau_temperatures``, a sampled decode's τ beside it at the same steps."""
  c = _tiny_config(tmp_path, steps=4, log_every=2)
  c.evaluate.tau_every = 2
  c.evaluate.tau_temperatures = (0.0, 1.0)
  record = train_task.run(c)
  curve = [r for r in metrics_log.read(tmp_path / "metrics.jsonl") if "tau/simulated" in r]
  assert [r["step"] for r in curve] == [0, 2, 4]
  assert all(r["tau/simulated"] >= 1.0 and r["tau/decoded_t1"] >= 1.0 for r in curve)
  check = record["tau_check"]
  assert check["simulated"] == curve[-1]["tau/simulated"]
  assert check["simulated"] == pytest.approx(check["decoded"], rel=1e-9)
  events = {(v.tag, e.step) for e in _events(tmp_path / "tensorboard") for v in e.summary.value}
  assert {(t, s) for t in ("tau/simulated", "tau/decoded_t1") for s in (0, 2, 4)} <= events
  # The sampled τ at the end is that of decoding the prompts at temperature 1 (the run's seed)
  # with the trained draft as the task saved it.
  t1 = c.copy_and_resolve_references()
  t1.temperature = 1.0
  t1.drafter.draft_model.source = "model"
  t1.drafter.draft_model.model.update(source="safetensors", path=str(tmp_path / "draft_final"))
  target = build.target(t1)
  drafter, dparams = build.drafter(t1, target)
  req = build.request(t1, target)
  outs = [generate(target.params, target.cfg, b, drafter=drafter, drafter_params=dparams,
                   **req.generate_kwargs()) for b in req.batches()]  # fmt: skip
  assert (
    curve[-1]["tau/decoded_t1"] == metrics.summarize(metrics.merge([o.counts for o in outs]))["tau"]
  )
