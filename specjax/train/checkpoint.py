"""Resumable train checkpoints: orbax, sharded, async, atomic, keep the last N.

Each checkpoint is a step directory with two items: ``state`` (the ``TrainState``: step,
trainable params, optimiser state, rng; every process writes its own shards) and ``meta``
(JSON: the objective's signature and the data settings). The data position is the step.

Atomicity is orbax's: a save is written under ``<step>.orbax-checkpoint-tmp`` and renamed to
``<step>`` only once every item (and, with several processes, every process) has finished, so a
process killed mid-save leaves a tmp directory that ``latest_step`` never reports and that the
next manager removes. A kill therefore costs at most the steps since the last finished save.

Restoring checks, before reading any array, that every leaf the run expects exists in the
checkpoint with the same shape and dtype, and names the first one that does not. After reading,
the arrays must match the checksum written into ``meta`` at save time (a SHA-256 over every
leaf's bytes), so damaged files are one clear error naming the checkpoint instead of a run that
silently continues from zeros or NaN; a checkpoint that cannot be read at all is the same error.
"""

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from specjax.parallel import path_str
from specjax.train.step import TrainState


def _as_dict(state: TrainState) -> dict[str, Any]:
  return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}


def _leaves(tree) -> dict[str, Any]:
  return {path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def digest(state: TrainState) -> str | None:
  """SHA-256 over every leaf's bytes in path order; None when some leaf is not fully held by
  this process (several processes: each would see only its shards)."""
  leaves = _leaves(_as_dict(state))
  if not all(getattr(x, "is_fully_addressable", True) for x in leaves.values()):
    return None
  h = hashlib.sha256()
  for name in sorted(leaves):
    h.update(name.encode())
    h.update(np.ascontiguousarray(jax.device_get(leaves[name])).tobytes())
  return h.hexdigest()


DAMAGED_FIX = (
  "delete that step directory (the run resumes from the one before) or use a new workdir"
)


# Signature keys added after checkpoints were first written: a checkpoint without them is not
# checked for them (it resumes as it did), one with them is.
SIGNED_LATER = ("global_batch", "target", "loss", "rows")


class Checkpointer:
  """``ocp.CheckpointManager`` for one run directory; every process makes one and calls save."""

  def __init__(self, directory: str | Path, *, keep: int = 3, async_save: bool = True):
    if keep < 1:
      raise ValueError(f"checkpoint keep must be >= 1, got {keep}.")
    self.directory = Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(
      max_to_keep=keep,
      enable_async_checkpointing=async_save,
      cleanup_tmp_directories=True,
      create=True,
    )
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def latest_step(self) -> int | None:
    """The newest finished checkpoint; tmp directories of interrupted saves never count."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: TrainState, meta: dict[str, Any]) -> None:
    """Starts an (async) save of ``state`` as ``step``; returns once the device copy is taken.
    The state's checksum goes into ``meta``."""
    meta = meta | {"digest": digest(state)}
    self._manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(_as_dict(state)), meta=ocp.args.JsonSave(meta)
      ),
    )

  def read_meta(self, step: int) -> dict[str, Any]:
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def check_signature(self, step: int, signature: dict[str, Any], keys=None) -> None:
    """Raises if the checkpoint at ``step`` was written by another run setup (its objective's
    shapes, global batch, target), read from its JSON alone; ``keys``: only these."""
    saved = self._reading(step, lambda: self.read_meta(step)).get("signature", {})
    signature = json.loads(json.dumps(signature))  # as saved: tuples read back as lists
    diff = sorted(
      k
      for k in set(saved) | set(signature)
      if saved.get(k) != signature.get(k)
      and (k in saved or k not in SIGNED_LATER)
      and (keys is None or k in keys)
    )
    if diff:
      raise ValueError(
        f"checkpoint {self.directory}/{step} was written by another run setup: "
        + "; ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {signature.get(k)!r}" for k in diff)
        + ". Use a new workdir, or restore the settings it was trained with."
      )

  def restore(self, step: int, abstract: TrainState, signature: dict[str, Any]) -> TrainState:
    """The checkpoint at ``step``, sharded like ``abstract``; raises if it is another model's."""
    meta = self._reading(step, lambda: self.read_meta(step))
    self._check_leaves(step, abstract)
    self.check_signature(step, signature)
    restored = self._reading(
      step,
      lambda: self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(_as_dict(abstract)))
      ),
    )
    state = TrainState(**restored["state"])
    want = meta.get("digest")
    if want is not None and digest(state) not in (None, want):
      raise ValueError(
        f"checkpoint {self.directory}/{step} is damaged: its arrays do not match the checksum "
        f"written when it was saved; {DAMAGED_FIX}."
      )
    return state

  def _reading(self, step: int, read):
    """``read()``; a damaged checkpoint's orbax/TensorStore error (often ~150 lines) becomes
    one line naming it."""
    try:
      return read()
    except Exception as e:
      text = str(e).strip()
      first = text.splitlines()[0][:160] if text else type(e).__name__
      raise ValueError(
        f"checkpoint {self.directory}/{step} cannot be read ({first}...): it is damaged; "
        f"{DAMAGED_FIX}."
      ) from None

  def _check_leaves(self, step: int, abstract: TrainState) -> None:
    saved = _leaves(self._reading(step, lambda: self._manager.item_metadata(step))["state"])
    wanted = _leaves(_as_dict(abstract))
    where = f"checkpoint {self.directory}/{step}"
    fix = (
      "It is from another model shape: use a new workdir or the model config it was trained with."
    )
    # Params first: a params leaf names the mismatch more clearly than its optimiser moments.
    for name in sorted(wanted, key=lambda n: (not n.startswith("params/"), n)):
      leaf = wanted[name]
      if name not in saved:
        raise ValueError(f"{where} has no leaf {name!r} that this model has. {fix}")
      got = saved[name]
      if tuple(got.shape) != tuple(leaf.shape) or got.dtype != leaf.dtype:
        raise ValueError(
          f"{where}: leaf {name!r} is {got.dtype}{list(got.shape)} there but "
          f"{leaf.dtype}{list(leaf.shape)} in this model. {fix}"
        )
    extra = sorted(set(saved) - set(wanted))
    if extra:
      raise ValueError(f"{where} has leaf {extra[0]!r} that this model lacks. {fix}")

  def wait(self) -> None:
    """Blocks until the last async save is finished (renamed into place)."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
