"""The train state, the optax optimiser, and the one jitted train step with explicit shardings.

    state, metrics = step_fn(state, frozen, batch)   # state donated; metrics replicated

``TrainState`` is everything a resumed run needs besides the data position, which is the step
itself (``Dataset.batch(step, ...)`` is a pure function of it): step, trainable params, optimiser
state and the rng, kept as raw key data so checkpoints store it as a plain uint32 array.

``compile_steps`` is the one place the step crosses the jit boundary: state, frozen target and
batch shardings come from the objective's partition rules and the mesh; the state is donated so
params and optimiser state are updated in place.
"""

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import Mesh

from specjax import parallel
from specjax.train.objectives import Objective
from specjax.typing import Params


@struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: steps taken, and the index of the next batch
  params: Params  # trainable params only; the frozen target lives outside the state
  opt_state: Any
  rng: jax.Array  # uint32 raw key data (jax.random.key_data)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW with global-norm clipping; linear warmup, then constant or cosine decay."""

  learning_rate: float = 1e-3
  warmup_steps: int = 0
  decay_steps: int = 0  # cosine decay over this many steps after warmup; 0 = constant
  end_lr_fraction: float = 0.1  # the cosine ends at learning_rate * this
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.95
  grad_clip: float = 1.0  # max global gradient norm; 0 = off

  def __post_init__(self):
    # Not finite (nan passes no comparison but fails none either): NaN gradients after training
    # steps, blamed on the learning rate.
    if not 0 < self.learning_rate < math.inf:
      raise ValueError(
        f"config.optim.learning_rate must be finite and > 0, got {self.learning_rate}."
      )
    for field in ("warmup_steps", "decay_steps", "grad_clip", "weight_decay"):
      if not 0 <= getattr(self, field) < math.inf:
        raise ValueError(
          f"config.optim.{field} must be finite and >= 0, got {getattr(self, field)}."
        )
    for field in ("b1", "b2"):  # Adam's moment decays: 1 never forgets, past it they diverge
      if not 0 <= getattr(self, field) < 1:
        raise ValueError(f"config.optim.{field} must be in [0, 1), got {getattr(self, field)}.")
    if not 0 <= self.end_lr_fraction <= 1:  # below 0 the cosine ends in gradient ascent
      raise ValueError(
        f"config.optim.end_lr_fraction must be in [0, 1] (of learning_rate), got "
        f"{self.end_lr_fraction}."
      )

  def schedule(self) -> optax.Schedule:
    lr, w = self.learning_rate, self.warmup_steps
    if self.decay_steps:
      return optax.warmup_cosine_decay_schedule(
        0.0, lr, w, w + self.decay_steps, lr * self.end_lr_fraction
      )
    if w:
      return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, w), optax.constant_schedule(lr)], [w]
      )
    return optax.constant_schedule(lr)

  def optimizer(self) -> optax.GradientTransformation:
    adamw = optax.adamw(self.schedule(), self.b1, self.b2, weight_decay=self.weight_decay)
    return (
      optax.chain(optax.clip_by_global_norm(self.grad_clip), adamw) if self.grad_clip else adamw
    )


def _keys(seed: int) -> tuple[jax.Array, jax.Array]:
  """(params init key, rng key) of a run with this seed."""
  key_init, key_rng = jax.random.split(jax.random.key(seed))
  return key_init, key_rng


def initial_params(frozen: Params, *, seed: int, objective: Objective) -> Params:
  """The trainable params a run with ``seed`` starts from: the untrained baseline."""
  return objective.init(_keys(seed)[0], frozen)


def init_state(frozen: Params, *, seed: int, objective: Objective, tx) -> TrainState:
  key_init, key_rng = _keys(seed)
  params = objective.init(key_init, frozen)
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    rng=jax.random.key_data(key_rng),
  )


def train_step(state: TrainState, frozen: Params, batch, *, objective: Objective, optim):
  """One optimiser step on one global batch; pure."""
  rng, key = jax.random.split(jax.random.wrap_key_data(state.rng))
  grad_fn = jax.value_and_grad(objective.loss, has_aux=True)
  (loss, aux), grads = grad_fn(state.params, frozen, batch, key)
  updates, opt_state = optim.optimizer().update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {
    "loss": loss,
    **aux,
    "grad_norm": optax.tree.norm(grads),
    "lr": optim.schedule()(state.step),
  }
  new = TrainState(state.step + 1, params, opt_state, jax.random.key_data(rng))
  return new, metrics


def eval_step(params: Params, frozen: Params, batch, *, objective: Objective):
  loss, aux = objective.loss(params, frozen, batch, jax.random.key(0))
  return {"loss": loss, **aux}


@dataclasses.dataclass(frozen=True)
class Steps:
  """The jitted functions of one run, and the shardings they were compiled for."""

  init: Any  # (frozen) -> TrainState
  train: Any  # (state, frozen, batch) -> (state, metrics); state donated
  eval: Any  # (params, frozen, batch) -> metrics
  abstract_state: TrainState  # ShapeDtypeStructs carrying their shardings
  state_shardings: TrainState
  frozen_shardings: Params


def compile_steps(
  objective: Objective, optim: OptimConfig, mesh: Mesh, frozen: Params, seed: int
) -> Steps:
  """Shardings from the partition rules, then ``jax.jit`` with explicit in/out shardings.

  Cached on (objective, optimiser, mesh, seed, frozen shapes): a run resumed in the same
  process, or a second run of the same config, reuses the compiled step.
  """
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), frozen)
  leaves, treedef = jax.tree.flatten(shapes)
  return _compile_steps(objective, optim, mesh, seed, treedef, tuple(leaves))


@functools.lru_cache(maxsize=8)
def _compile_steps(objective, optim, mesh, seed, frozen_treedef, frozen_leaves) -> Steps:
  frozen = jax.tree.unflatten(frozen_treedef, frozen_leaves)
  frozen_sh = parallel.shardings(frozen, objective.frozen_rules, mesh)
  init = functools.partial(init_state, seed=seed, objective=objective, tx=optim.optimizer())
  shapes = jax.eval_shape(init, frozen)
  state_sh = parallel.shardings(shapes, objective.rules, mesh)
  rep, batch_sh = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  abstract = jax.tree.map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, state_sh
  )
  return Steps(
    init=jax.jit(init, in_shardings=(frozen_sh,), out_shardings=state_sh),
    train=jax.jit(
      functools.partial(train_step, objective=objective, optim=optim),
      in_shardings=(state_sh, frozen_sh, batch_sh),
      out_shardings=(state_sh, rep),
      donate_argnums=0,
    ),
    eval=jax.jit(
      functools.partial(eval_step, objective=objective),
      in_shardings=(state_sh.params, frozen_sh, batch_sh),
      out_shardings=rep,
    ),
    abstract_state=abstract,
    state_shardings=state_sh,
    frozen_shardings=frozen_sh,
  )
