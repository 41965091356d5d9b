"""The train loop: one jitted step over a sharded state; eval, metrics, checkpoints, resume.

    result = loop.train(objective, target_params, train_ds, eval_ds, LoopConfig(...),
                        OptimConfig(...), parallel.make_mesh(MeshConfig(...)))

Every process runs this same function (multi-controller JAX). Each step, every process asks the
dataset for its own rows of global batch ``step`` and the rows become one global array sharded
over the mesh's data x fsdp axes. Because that is a pure function of the step, the data position
needs no state of its own: a resumed run restores step, params, optimiser state and rng from the
newest finished checkpoint and continues exactly as if never stopped.

Process 0 alone writes ``metrics.jsonl`` (every ``log_every`` steps, the mean over those steps
of loss, KL, acceptance, gradient norm and learning rate, plus tokens/s), eval records (every
``eval_every`` steps) and shows the progress bar. Every process takes part in checkpoints
(orbax writes each process's shards).
"""

import contextlib
import dataclasses
import fcntl
import os
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from tqdm.auto import tqdm

from specjax import parallel, profiling
from specjax.drafters.base import check_seed
from specjax.train import checkpoint as checkpoint_lib
from specjax.train.metrics_log import MetricsLog
from specjax.train.objectives import Objective
from specjax.train.step import OptimConfig, TrainState, compile_steps
from specjax.typing import Params


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  steps: int  # total optimiser steps of the run (a resumed run stops at the same step)
  global_batch: int  # rows per step over all processes
  seed: int = 0  # params init and data order
  workdir: str = ""  # checkpoints/, metrics.jsonl and tensorboard/ go here; "" = none
  log_every: int = 10
  eval_every: int = 0  # 0 = only at the end (when there is an eval set)
  eval_batches: int = 1  # global batches of the eval set per evaluation
  checkpoint_every: int = 0  # 0 = only at the end
  keep: int = 3  # newest checkpoints kept
  async_checkpoint: bool = True
  resume: bool = True  # continue from the newest checkpoint in workdir; False: refuse one
  progress: bool = True
  profile: str = ""  # a directory: profile_steps steps after this run's first are traced there
  profile_steps: int = 3
  probe_every: int = 0  # train()'s probe every this many steps (and at 0 and the end); 0 = never

  def __post_init__(self):
    for field in ("steps", "global_batch", "log_every", "eval_batches", "keep"):
      if getattr(self, field) < 1:
        raise ValueError(f"config.train.{field} must be >= 1, got {getattr(self, field)}.")
    check_seed(self.seed, "config.train.seed")
    for field in ("eval_every", "checkpoint_every", "probe_every"):
      if getattr(self, field) < 0:
        raise ValueError(f"config.train.{field} must be >= 0, got {getattr(self, field)}.")


@dataclasses.dataclass
class Result:
  state: TrainState
  history: list[dict[str, Any]]  # the records this call logged (process 0; else empty)
  start_step: int  # 0, or the checkpoint step it resumed from


def check(loop: LoopConfig, mesh: Mesh, train_ds, eval_ds=None) -> None:
  """Every cheap check, before anything is compiled."""
  parallel.batch_size_per_shard(loop.global_batch, mesh)
  pc = jax.process_count()
  if loop.global_batch % pc:
    raise ValueError(
      f"train.global_batch={loop.global_batch} is not divisible by the {pc} processes."
    )
  for name, ds in (("train", train_ds), ("eval", eval_ds)):
    if ds is not None and len(ds) < loop.global_batch:
      raise ValueError(
        f"the {name} set has {len(ds)} examples, fewer than train.global_batch="
        f"{loop.global_batch}: add data or lower global_batch."
      )


def _global_batch(ds, step: int, loop: LoopConfig, mesh: Mesh) -> dict[str, jax.Array]:
  local = ds.batch(
    step,
    loop.global_batch,
    seed=loop.seed,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )
  return parallel.host_batch_to_global(local, mesh, loop.global_batch)


def _evaluate(steps, state, frozen, eval_ds, loop, mesh) -> dict[str, float]:
  ms = [
    jax.device_get(steps.eval(state.params, frozen, _global_batch(eval_ds, i, loop, mesh)))
    for i in range(loop.eval_batches)
  ]
  return {f"eval/{k}": float(np.mean([m[k] for m in ms])) for k in ms[0]}


@contextlib.contextmanager
def workdir_lock(workdir: Path | None):
  """Holds ``workdir/.lock`` for the run: a second run on the same workdir is refused at once
  (two runs writing one set of checkpoints both crash at their first save otherwise)."""
  if workdir is None or jax.process_index() != 0:
    yield
    return
  workdir.mkdir(parents=True, exist_ok=True)
  with open(workdir / ".lock", "a+") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      holder = f.read().strip() or "?"
      raise ValueError(
        f"config.workdir={str(workdir)!r} is in use by another training run (pid {holder}): "
        "wait for it, stop it, or give this run another workdir."
      ) from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _check_finite(m: dict, first: int, last: int, ckpt) -> None:
  """Stops a run whose loss or gradients turned non-finite, before it logs or saves them."""
  bad = {k: v for k, v in m.items() if k in ("loss", "grad_norm") and not np.isfinite(v)}
  if bad:
    kept = ckpt.latest_step() if ckpt is not None else None
    where = f"step {last}" if first == last else f"steps {first}-{last}"
    raise FloatingPointError(
      f"training stopped: {', '.join(f'{k} = {v}' for k, v in bad.items())} at {where}. "
      + (f"The newest checkpoint (step {kept}) is from before; " if kept else "")
      + "lower optim.learning_rate or check the data and the params it started from."
    )


def train(
  objective: Objective,
  target_params: Params,
  train_ds,
  eval_ds,
  loop: LoopConfig,
  optim: OptimConfig,
  mesh: Mesh,
  meta: dict[str, Any] | None = None,
  setup: dict[str, Any] | None = None,
  probe=None,
) -> Result:
  """Trains ``objective`` for ``loop.steps`` steps (or the rest of them, when resuming), holding
  the workdir's lock. A resumed run must share the checkpoint's objective signature, global
  batch, training rows (an in-memory dataset's fingerprint) and ``setup`` (JSON: e.g. the
  target's fingerprint), or it is refused. ``probe`` (params -> {name: value}) is recorded
  every ``loop.probe_every`` steps, at step 0 and at the end, on the main process."""
  check(loop, mesh, train_ds, eval_ds)
  with workdir_lock(Path(loop.workdir) if loop.workdir else None):
    return _train(
      objective, target_params, train_ds, eval_ds, loop, optim, mesh, meta, setup, probe
    )


def _train(
  objective, target_params, train_ds, eval_ds, loop, optim, mesh, meta, setup, probe
) -> Result:
  is_main = jax.process_index() == 0
  workdir = Path(loop.workdir) if loop.workdir else None
  # In-memory rows are fingerprinted (streamed files resume by their data state).
  rows = {"rows": train_ds.fingerprint()} if hasattr(train_ds, "fingerprint") else {}
  run_setup = {"global_batch": loop.global_batch, **rows} | (setup or {})
  signature = objective.signature() | run_setup
  ckpt, start, latest = None, 0, None
  if workdir is not None:
    ckpt = checkpoint_lib.Checkpointer(
      workdir / "checkpoints", keep=loop.keep, async_save=loop.async_checkpoint
    )
    latest = ckpt.latest_step()
    if latest is not None and not loop.resume:  # a save at or below it would be skipped
      raise ValueError(
        f"config.train.resume=False, but {workdir / 'checkpoints'} holds an earlier run's "
        f"checkpoints (the newest at step {latest}): a run that starts afresh needs a new "
        "workdir (this one is left as it is)."
      )
    if latest is not None:  # another run setup is refused before anything compiles (the
      ckpt.check_signature(latest, signature, run_setup)  # objective's shapes: at restore)
  steps = compile_steps(objective, optim, mesh, target_params, loop.seed)
  frozen = parallel.put_global(target_params, steps.frozen_shardings)
  if latest is not None:
    state = ckpt.restore(latest, steps.abstract_state, signature)
    start = latest
    if is_main:
      tqdm.write(
        f"resumed from step {latest} of {loop.steps} (the newest checkpoint in "
        f"{workdir / 'checkpoints'}; another workdir starts afresh)"
      )
  if start == 0:
    state = steps.init(frozen)
  log = None
  if workdir is not None and is_main:
    log = MetricsLog(workdir / "metrics.jsonl", start, tensorboard_dir=workdir / "tensorboard")
  seq_len = train_ds.seq_len
  history: list[dict[str, Any]] = []

  def emit(record):
    if is_main:
      history.append(record)
      if log is not None:
        log.write(record)

  probing = probe is not None and loop.probe_every > 0
  if probing and start == 0 and is_main:
    emit({"step": 0, **probe(state.params)})
  bar = tqdm(total=loop.steps, initial=start, disable=not (loop.progress and is_main), unit="step")
  t_window, n_window, window_sum = time.perf_counter(), 0, None
  tracing = contextlib.ExitStack()
  traced = range(start + 1, min(start + 1 + loop.profile_steps, loop.steps)) if loop.profile else ()
  try:
    for step in range(start, loop.steps):
      if traced and step == traced.start and is_main:  # compiled by the run's first step
        what = f"train steps {traced.start + 1}..{traced.stop}"
        tracing.enter_context(profiling.trace(loop.profile, what))
      batch = _global_batch(train_ds, step, loop, mesh)
      state, metrics = steps.train(state, frozen, batch)
      if traced and step == traced.stop - 1:
        jax.block_until_ready(state)
        tracing.close()
      # Summed on device (no host sync per step), averaged when logged.
      window_sum = metrics if window_sum is None else jax.tree.map(jnp.add, window_sum, metrics)
      done = step + 1
      n_window += 1
      bar.update(1)
      saving = ckpt is not None and (
        (loop.checkpoint_every and done % loop.checkpoint_every == 0) or done == loop.steps
      )
      if saving or done % loop.log_every == 0 or done == loop.steps:
        m = {k: float(v) / n_window for k, v in jax.device_get(window_sum).items()}
        _check_finite(m, done - n_window + 1, done, ckpt)
      if done % loop.log_every == 0 or done == loop.steps:
        dt = time.perf_counter() - t_window
        m["tokens_per_s"] = n_window * loop.global_batch * seq_len / dt
        m["step_s"] = dt / n_window
        emit({"step": done, **m})
        bar.set_postfix(loss=f"{m['loss']:.4f}", tok_s=f"{m['tokens_per_s']:.0f}")
        t_window, n_window, window_sum = time.perf_counter(), 0, None
      is_eval = (loop.eval_every and done % loop.eval_every == 0) or done == loop.steps
      if eval_ds is not None and is_eval:
        emit({"step": done, **_evaluate(steps, state, frozen, eval_ds, loop, mesh)})
      if probing and is_main and (done % loop.probe_every == 0 or done == loop.steps):
        emit({"step": done, **probe(state.params)})
      if saving:
        ckpt.save(done, state, {"signature": signature, "step": done, **(meta or {})})
  except jax.errors.JaxRuntimeError as e:
    if jax.process_count() == 1:
      raise
    raise RuntimeError(
      f"training failed in a cross-process operation near step {bar.n} ({e}). Another process "
      "of this multi-process run most likely died: check its log, then restart every process "
      "(the run resumes from the newest checkpoint)."
    ) from e
  finally:
    tracing.close()
    bar.close()
    if ckpt is not None:
      ckpt.wait()
      ckpt.close()
    if log is not None:
      log.close()
  return Result(state=state, history=history, start_step=start)
