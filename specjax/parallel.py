"""Device mesh, partition rules and multi-process start-up: JAX's own GSPMD, nothing home-made.

One code path runs on one CPU, on an 8-device emulated mesh and on a pod slice; only the
``MeshConfig`` changes. The mesh has three named axes:

    data    pure data parallelism: params replicated, batch rows split
    fsdp    batch rows split too, and params/optimiser state sharded (ZeRO-3 style)
    tensor  Megatron-style model parallelism: heads, MLP width and vocab split

Partition rules map a regex over a leaf's path (``layers/3/wq``, ``1/mu/layers/3/wq`` inside an
optax state) to a ``PartitionSpec``; the first match wins and an unmatched leaf is replicated.
A model's rules come from its parameter schema (``llama.RULES``, ``schema.partition_rules``).
Optimiser state mirrors the params' paths, so the same rules shard it. A rule's mesh axis that
does not divide the leaf's dimension is dropped for that leaf (the dimension is replicated), so
rules written for a real model also serve a tiny test model.

Batches are split over ``("data", "fsdp")``. Each process holds only its own rows; they become
one global ``jax.Array`` with ``jax.make_array_from_process_local_data``.
"""

import dataclasses
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
Rules = Sequence[tuple[str, P]]


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Axis sizes of the device mesh; one of them may be -1: "every device left over"."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1

  def __post_init__(self):
    sizes = dataclasses.asdict(self)
    for axis, n in sizes.items():
      if n == 0 or n < -1:
        raise ValueError(f"mesh.{axis} must be >= 1 (or -1 for the remaining devices), got {n}.")
    if sum(n == -1 for n in sizes.values()) > 1:
      raise ValueError("At most one of mesh.data, mesh.fsdp, mesh.tensor may be -1.")

  def shape(self, num_devices: int) -> tuple[int, int, int]:
    """The resolved (data, fsdp, tensor) sizes; their product must equal ``num_devices``."""
    sizes = [self.data, self.fsdp, self.tensor]
    fixed = int(np.prod([n for n in sizes if n != -1]))
    if -1 in sizes:
      if num_devices % fixed:
        raise ValueError(
          f"mesh {self._describe()} cannot fill {num_devices} devices: {num_devices} is not a "
          f"multiple of {fixed}. Set mesh sizes whose product is {num_devices}."
        )
      sizes[sizes.index(-1)] = num_devices // fixed
    if fixed > num_devices or int(np.prod(sizes)) != num_devices:
      raise ValueError(
        f"mesh {self._describe()} needs {int(np.prod(sizes))} devices but {num_devices} are "
        f"available: the mesh is larger than the devices or leaves some idle. Set mesh sizes "
        f"whose product is {num_devices} (use -1 for one axis to take the rest)."
      )
    return tuple(sizes)

  def _describe(self) -> str:
    return f"(data={self.data}, fsdp={self.fsdp}, tensor={self.tensor})"


def make_mesh(cfg: MeshConfig, devices: Sequence[Any] | None = None) -> Mesh:
  """A mesh over all devices (of every process), axes ``AXES``; raises if the sizes don't fit."""
  devices = list(jax.devices() if devices is None else devices)
  shape = cfg.shape(len(devices))
  return jax.make_mesh(shape, AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices)


def batch_size_per_shard(global_batch: int, mesh: Mesh) -> int:
  """Rows per batch shard; raises unless ``global_batch`` splits evenly over data x fsdp."""
  n = mesh.shape["data"] * mesh.shape["fsdp"]
  if global_batch < 1 or global_batch % n:
    raise ValueError(
      f"global_batch={global_batch} is not divisible by the mesh's batch axes "
      f"(data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']} = {n}); set global_batch to a "
      f"multiple of {n}."
    )
  return global_batch // n


# -- partition rules ----------------------------------------------------------------------------


def path_str(path: Sequence[Any]) -> str:
  """``(DictKey('layers'), SequenceKey(3), DictKey('wq'))`` -> ``'layers/3/wq'``."""
  parts = []
  for k in path:
    for attr in ("key", "idx", "name"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def _fit(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
  """Drops axes that don't divide their dimension (or dimensions the leaf doesn't have)."""
  if len(spec) > len(shape):
    return P()
  out = []
  for dim, axes in zip(shape, spec, strict=False):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
    out.append(axes if names and dim % size == 0 else None)
  return P(*out)


def spec_for(name: str, shape: tuple[int, ...], rules: Rules, mesh: Mesh) -> P:
  """The ``PartitionSpec`` of the leaf at path ``name`` (``'layers/3/wq'``): the first rule
  whose regex matches, fitted to ``shape`` on ``mesh``; replicated if none does."""
  for pattern, spec in rules:
    if re.search(pattern, name):
      return _fit(spec, tuple(shape), mesh)
  return P()


def partition_specs(tree: Any, rules: Rules, mesh: Mesh) -> Any:
  """A ``PartitionSpec`` per leaf of ``tree`` (arrays or ShapeDtypeStructs), by path regex."""
  return jax.tree_util.tree_map_with_path(
    lambda path, leaf: spec_for(path_str(path), getattr(leaf, "shape", ()), rules, mesh), tree
  )


def shardings(tree: Any, rules: Rules, mesh: Mesh) -> Any:
  """``NamedSharding`` per leaf: ``partition_specs`` on ``mesh``."""
  specs = partition_specs(tree, rules, mesh)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows over data x fsdp, everything else whole."""
  return NamedSharding(mesh, P(BATCH_AXES))


def put_global(tree: Any, shards: Any) -> Any:
  """Host values every process holds in full (numpy or single-device) -> global sharded arrays.

  Works with several processes too: each process fills only its own devices' slices.
  """

  def put(x, sharding):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

  return jax.tree.map(put, tree, shards)


def host_batch_to_global(
  local: Mapping[str, np.ndarray], mesh: Mesh, global_batch: int
) -> dict[str, jax.Array]:
  """This process's batch rows -> global arrays of ``global_batch`` rows split over data x fsdp."""
  sharding = batch_sharding(mesh)
  return {
    k: jax.make_array_from_process_local_data(sharding, v, (global_batch, *v.shape[1:]))
    for k, v in local.items()
  }


# -- several processes --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """How this process joins a multi-process run (``num_processes == 1``: it does not).

  A process that stops sending heartbeats for ``heartbeat_timeout_s`` is declared dead and
  every other process then aborts with "Terminating process because the JAX distributed
  service detected fatal errors ... another task died": a dead peer costs a bounded wait,
  never a hang.
  """

  coordinator_address: str = ""  # host:port of process 0's coordinator
  num_processes: int = 1
  process_id: int = 0
  heartbeat_timeout_s: int = 60
  initialization_timeout_s: int = 300

  def __post_init__(self):
    if self.num_processes < 1:
      raise ValueError(f"distributed.num_processes must be >= 1, got {self.num_processes}.")
    if not 0 <= self.process_id < self.num_processes:
      raise ValueError(
        f"distributed.process_id={self.process_id} must be in [0, {self.num_processes})."
      )
    if self.num_processes > 1 and not re.fullmatch(r"[^:\s]+:\d+", self.coordinator_address):
      raise ValueError(
        f"distributed.coordinator_address={self.coordinator_address!r} must be 'host:port' "
        "(process 0's address, e.g. '127.0.0.1:12355') for a multi-process run."
      )
    for field in ("heartbeat_timeout_s", "initialization_timeout_s"):
      if getattr(self, field) < 1:
        raise ValueError(f"distributed.{field} must be >= 1 s, got {getattr(self, field)}.")


def initialize(cfg: DistributedConfig, on_timeout=os._exit) -> None:
  """Joins the run with ``jax.distributed.initialize``; a no-op for a single process.

  Call before anything touches a device. Cross-process collectives between CPU devices need
  gloo (the setting only concerns CPU devices, so it is harmless on accelerators). A run not
  joined within ``initialization_timeout_s`` ends this process with one error line naming the
  peer that never came (``_watch_join``), not JAX's native abort.
  """
  if cfg.num_processes == 1:
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  joined = threading.Event()
  threading.Thread(
    target=_watch_join, args=(cfg, joined, on_timeout), daemon=True, name="specjax-join"
  ).start()
  try:
    jax.distributed.initialize(
      coordinator_address=cfg.coordinator_address,
      num_processes=cfg.num_processes,
      process_id=cfg.process_id,
      # JAX's own deadline aborts the process natively (exit 134): the watch ends it first.
      initialization_timeout=cfg.initialization_timeout_s + JOIN_MARGIN_S,
      heartbeat_timeout_seconds=cfg.heartbeat_timeout_s,
      shutdown_timeout_seconds=cfg.heartbeat_timeout_s,
    )
  finally:
    joined.set()


JOIN_MARGIN_S = 30


def _watch_join(cfg: DistributedConfig, joined: threading.Event, on_timeout) -> None:
  """Ends the process with one error line (exit 1) if the run is not joined within
  ``initialization_timeout_s``: a peer that never started, or another coordinator address."""
  if joined.wait(cfg.initialization_timeout_s):
    return
  n, me = cfg.num_processes, cfg.process_id
  missing = f"process {1 - me}" if n == 2 else f"at least one of the other {n - 1} processes"
  sys.stderr.write(
    f"error: process {me} of {n} waited {cfg.initialization_timeout_s} s "
    f"(config.distributed.initialization_timeout_s) at {cfg.coordinator_address} and "
    f"{missing} never joined: start every process (process_id 0..{n - 1}) with the same "
    "coordinator_address and num_processes, or raise the timeout.\n"
  )
  sys.stderr.flush()
  on_timeout(1)
