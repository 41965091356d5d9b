"""Decoding on a device mesh: where each array lives, what every device holds, what is refused.

``generate(..., mesh=...)`` runs the same one-jit loop as on one device; only the placement
changes, and GSPMD inserts the collectives:

    target / drafter weights   tensor-parallel by their partition rules (``llama.RULES``):
                               attention heads, MLP width and the vocabulary over ``tensor``
    KV caches                  rows over ``data``, kv heads over ``tensor``  [B, G, S, Dh]
    tokens, lengths, budgets   rows over ``data``
    sampling knobs, key, metrics   replicated

Every row's acceptance, lengths and stop state stay per row, as on one device: rows are never
mixed, a data shard just holds fewer of them. Decoding meshes leave ``fsdp`` at 1: weights
sharded over the batch axes would be gathered in full at every step of the loop.

Sizes are checked before any weight loads (from the model's header): the tensor axis must
divide the heads, kv heads, MLP width and vocabulary; the data axis must divide the batch; the
mesh must fit the devices. ``footprint`` gives the parameter and cache bytes one device holds,
and ``check_fits`` refuses, with the sizes, a run that cannot fit a device's memory.
"""

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import parallel
from specjax.models.config import ModelConfig

CACHE_SPEC = P(parallel.BATCH_AXES, "tensor")  # [B, G, S, Dh]: rows over data, kv heads over tensor
ROWS_SPEC = P(parallel.BATCH_AXES)


def mesh_for(cfg: parallel.MeshConfig, devices: Sequence[Any] | None = None) -> Mesh | None:
  """The decoding mesh over the first ``data x tensor`` devices (every device for a -1 axis,
  and always every process's devices in a multi-process run); None for one device."""
  check_decoding(cfg)
  devices = list(jax.devices() if devices is None else devices)
  sizes = (cfg.data, cfg.fsdp, cfg.tensor)
  if jax.process_count() == 1:
    wanted = math.prod(cfg.shape(len(devices))) if -1 in sizes else math.prod(sizes)
    if wanted > len(devices):
      raise ValueError(
        f"mesh (data={cfg.data}, tensor={cfg.tensor}) needs {wanted} devices but "
        f"{len(devices)} are available: set mesh.data x mesh.tensor to at most {len(devices)} "
        "(on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N emulates N devices)."
      )
    if wanted == 1:
      return None
    if wanted < len(devices):
      devices = devices[:wanted]
  return parallel.make_mesh(cfg, devices)


def check_decoding(cfg: parallel.MeshConfig) -> None:
  if cfg.fsdp != 1:
    raise ValueError(
      f"mesh.fsdp={cfg.fsdp}: decoding shards weights over mesh.tensor only (fsdp would gather "
      "every weight at every step). Set mesh.fsdp=1 and use mesh.data for rows."
    )


def check_model(mesh_shape: dict, cfg: ModelConfig, what: str = "target") -> None:
  """The tensor axis divides every dimension it splits: heads, kv heads, MLP width, vocab."""
  t = mesh_shape.get("tensor", 1)
  dims = {
    "num_heads": cfg.num_heads,
    "num_kv_heads": cfg.num_kv_heads,
    "ffn_dim": cfg.ffn_dim,
    "vocab_size": cfg.vocab_size,
  }
  for name, n in dims.items():
    if n % t:
      fits = [d for d in range(1, min(dims.values()) + 1) if all(v % d == 0 for v in dims.values())]
      raise ValueError(
        f"mesh.tensor={t} does not divide the {what}'s {name}={n} ({cfg.name!r}); tensor "
        f"parallelism splits it evenly. Use mesh.tensor in {fits} (and the rest for mesh.data)."
      )


def check_batch(mesh_shape: dict, batch: int) -> None:
  n = mesh_shape.get("data", 1) * mesh_shape.get("fsdp", 1)
  if batch % n:
    raise ValueError(
      f"batch_size={batch} is not divisible by mesh.data={n}: every data shard holds the same "
      f"number of rows. Set batch_size to a multiple of {n}."
    )


# -- placing arrays -----------------------------------------------------------------------------


def place(tree: Any, rules: parallel.Rules, mesh: Mesh) -> Any:
  """``tree`` as global arrays sharded by ``rules``. Leaves already placed so stay as they are
  (placing once and passing the result to every ``generate`` call moves nothing); host values
  are split by every process alike, each filling only its own devices."""
  if tree is None:
    return None
  want = parallel.shardings(tree, rules, mesh)

  def put(x, sharding):
    if isinstance(x, jax.Array) and x.sharding == sharding:
      return x
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return jax.device_put(x, sharding)
    return parallel.put_global(np.asarray(x), sharding)

  return jax.tree.map(put, tree, want)


def put_rows(x: Any, mesh: Mesh) -> jax.Array:
  """A host array every process holds in full, its leading (row) axis split over data."""
  return parallel.put_global(np.asarray(x), NamedSharding(mesh, ROWS_SPEC))


def put_replicated(tree: Any, mesh: Mesh) -> Any:
  return jax.tree.map(lambda x: parallel.put_global(np.asarray(x), parallel.replicated(mesh)), tree)


def constrain_cache(kv: tuple, mesh: Mesh | None) -> tuple:
  """Pins per-layer ``[B, G, S, Dh]`` buffers to rows over data, kv heads over tensor."""
  if mesh is None:
    return kv
  return tuple(jax.lax.with_sharding_constraint(x, NamedSharding(mesh, CACHE_SPEC)) for x in kv)


def fetch(x: jax.Array) -> np.ndarray:
  """A global array on this host, whole (rows other processes hold are gathered)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def local_rows(x: jax.Array) -> list[int]:
  """Indices of the rows of a row-sharded array that this process's devices hold."""
  rows: set[int] = set()
  for shard in x.addressable_shards:
    rows.update(range(x.shape[0])[shard.index[0]])
  return sorted(rows)


# -- what each device holds -----------------------------------------------------------------


def bytes_per_device(tree: Any, rules: parallel.Rules, mesh_shape: dict) -> int:
  """Bytes the most loaded device holds of ``tree`` (arrays or ShapeDtypeStructs) under
  ``rules``: each leaf's size over the product of the mesh axes that split it."""
  mesh = jax.sharding.AbstractMesh(tuple(mesh_shape.values()), tuple(mesh_shape))
  specs = parallel.partition_specs(tree, rules, mesh)
  total = 0
  leaves = jax.tree.leaves(tree)
  spec_leaves = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))
  for leaf, spec in zip(leaves, spec_leaves, strict=True):
    split = 1
    for axes in spec:
      for a in (axes,) if isinstance(axes, str) else tuple(axes or ()):
        split *= mesh_shape[a]
    total += -(-int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize // split)
  return total


def cache_bytes(cfg: ModelConfig, batch: int, num_slots: int, mesh_shape: dict, itemsize=4) -> int:
  """One device's share of a model's K and V caches: rows over data, kv heads over tensor."""
  rows = -(-batch // (mesh_shape.get("data", 1) * mesh_shape.get("fsdp", 1)))
  heads = -(-cfg.num_kv_heads // mesh_shape.get("tensor", 1))
  return 2 * cfg.num_layers * rows * heads * num_slots * cfg.head_dim * itemsize


@dataclasses.dataclass(frozen=True)
class Footprint:
  """Bytes one device holds for a decoding run, by part."""

  parts: dict[str, int]
  devices: int

  @property
  def total(self) -> int:
    return sum(self.parts.values())

  def describe(self) -> str:
    mib = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in self.parts.items())
    n = f"{self.devices} device" + "s" * (self.devices > 1)
    return f"per device ({n}): {mib}; total {self.total / 2**20:.1f} MiB"


def footprint(parts: dict[str, int], mesh_shape: dict) -> Footprint:
  return Footprint(dict(parts), int(np.prod(list(mesh_shape.values()))))


def device_memory() -> tuple[int, str] | None:
  """``(bytes, where)`` one device may use: the accelerator's own limit, or on a CPU the host's
  memory shared by its devices; None when neither is known."""
  dev = jax.local_devices()[0]
  stats = None
  try:
    stats = dev.memory_stats()
  except Exception:  # noqa: BLE001 - backends without memory stats
    stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), f"{dev.device_kind} memory"
  try:
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None
  n = jax.local_device_count()
  return host // n, f"this host's memory shared by {n} device" + "s" * (n > 1)


FIT_FIX = "lower max_len or the batch size, or spread the model over more devices (mesh.tensor)"


def check_fits(
  fp: Footprint | None,
  limit_gib: float = 0.0,
  field: str = "config.device_memory_gib",
  fix: str = FIT_FIX,
):
  """Refuses a run whose per-device bytes exceed ``limit_gib`` (0: the device's own memory),
  saying ``fix``; ``fp`` None checks the limit alone."""
  if not 0 <= limit_gib < float("inf"):
    raise ValueError(
      f"{field}={limit_gib:g} must be a number of GiB > 0, or 0 for the device's own memory."
    )
  if fp is None:
    return
  if limit_gib:
    limit, where = int(limit_gib * 2**30), f"{field}={limit_gib:g}"
  else:
    known = device_memory()
    if known is None:
      return
    limit, where = known
  if fp.total > limit:
    raise ValueError(
      f"this run needs {fp.describe()}, more than {limit / 2**30:.3g} GiB ({where}): {fix}."
    )
