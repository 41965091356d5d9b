"""Parameter schemas: an architecture describes each of its weights once; every consumer reads that.

A ``Param`` says everything specjax needs to know about one weight: its shape (from the model
config), how a random init draws it, how it is sharded over the device mesh, and what GGUF and
HF checkpoints call it. Random init, checkpoint loading, export, the shape check and the
partition rules all read the schema (``llama.SCHEMA``; drafter heads declare theirs the same
way), so adding or renaming a weight is one line.

Params are a dict: top-level weights by name, and per-layer weights in ``params["layers"]``, a
tuple of dicts (one per layer, so each layer's weights stay separate buffers).
"""

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

Rules = Sequence[tuple[str, P]]
always = lambda cfg: True  # noqa: E731


@dataclasses.dataclass(frozen=True)
class Param:
  """One weight of an architecture.

  ``init`` names a rule of ``init_params``: ``normal`` (N(0, 1/fan_in), fan_in the last axis),
  ``residual`` (``normal`` times ``residual_scale``: projections back into the residual stream),
  ``embed`` (N(0, embed_std)), ``head`` (``normal`` times ``embed_std * sqrt(D)``), ``bias``
  (N(0, 0.1)), ``ones``, ``zeros``. ``gguf`` and ``hf`` are checkpoint tensor names, with
  ``{i}`` for the layer index; None where that format has no such tensor.
  """

  name: str
  shape: Callable[[Any], tuple[int, ...]]
  init: str
  spec: P = P()
  gguf: str | None = None
  hf: str | None = None
  present: Callable[[Any], bool] = always
  per_layer: bool = False


Schema = Sequence[Param]
INIT_RULES = ("normal", "residual", "embed", "head", "bias", "ones", "zeros")


def entries(schema: Schema, cfg, num_layers: int) -> Iterator[tuple[tuple, Param]]:
  """``(path, param)`` for every weight ``cfg`` has: per-layer ones first, layer by layer, then
  the top-level ones (the order random init draws keys in). Paths are ``("layers", i, name)``
  or ``(name,)``."""
  for i in range(num_layers):
    for p in schema:
      if p.per_layer and p.present(cfg):
        yield ("layers", i, p.name), p
  for p in schema:
    if not p.per_layer and p.present(cfg):
      yield (p.name,), p


def assemble(values: dict[tuple, Any], num_layers: int) -> dict[str, Any]:
  """The params dict from ``{path: array}`` (paths as ``entries`` gives them)."""
  params: dict[str, Any] = {}
  layers = [{} for _ in range(num_layers)]
  for path, value in values.items():
    if path[0] == "layers":
      layers[path[1]][path[2]] = value
    else:
      params[path[0]] = value
  if num_layers:
    params["layers"] = tuple(layers)
  return params


def lookup(params, path: tuple):
  return params[path[0]][path[1]][path[2]] if path[0] == "layers" else params[path[0]]


def init_params(
  schema: Schema,
  cfg,
  key: jax.Array,
  num_layers: int,
  embed_std: float = 0.02,
  residual_scale: float = 1.0,
  dtype=jnp.float32,
) -> dict[str, Any]:
  """Random weights by each param's ``init`` rule (see ``Param``); one key per random weight."""
  todo = list(entries(schema, cfg, num_layers))
  keys = iter(jax.random.split(key, max(len(todo), 1)))

  def draw(p: Param, shape):
    if p.init == "ones":
      return jnp.ones(shape, dtype)
    if p.init == "zeros":
      return jnp.zeros(shape, dtype)
    k = next(keys)
    if p.init == "bias":
      return (0.1 * jax.random.normal(k, shape)).astype(dtype)
    if p.init == "embed":
      return (embed_std * jax.random.normal(k, shape)).astype(dtype)
    scale = {"normal": 1.0, "residual": residual_scale, "head": embed_std * cfg.dim**0.5}[p.init]
    return (jax.random.normal(k, shape) * scale / jnp.sqrt(shape[-1])).astype(dtype)

  return assemble({path: draw(p, p.shape(cfg)) for path, p in todo}, num_layers)


def shapes(schema: Schema, cfg, num_layers: int, dtype=jnp.float32) -> dict[str, Any]:
  """The params' shapes and dtype (``jax.ShapeDtypeStruct`` leaves) from the schema alone, as
  ``init_params`` would make them, without tracing or allocating anything."""
  structs = {
    path: jax.ShapeDtypeStruct(p.shape(cfg), dtype) for path, p in entries(schema, cfg, num_layers)
  }
  return assemble(structs, num_layers)


def check_shapes(schema: Schema, cfg, params, num_layers: int) -> None:
  """Raises a ValueError naming the first weight that is missing, extra or of the wrong shape."""
  expected = {path: p.shape(cfg) for path, p in entries(schema, cfg, num_layers)}
  got = {path: tuple(leaf.shape) for path, leaf in _leaves(params)}
  for path, shape in expected.items():
    if path not in got:
      raise ValueError(f"params lack {_name(path)} (shape {shape}) that {cfg.name!r} needs.")
    if got[path] != shape:
      raise ValueError(
        f"{_name(path)} has shape {got[path]}, expected {shape} for {cfg.name!r}: the params "
        "do not belong to this config."
      )
  extra = sorted(_name(p) for p in got.keys() - expected.keys())
  if extra:
    raise ValueError(f"params have weights {cfg.name!r} does not use: {extra[:8]}.")


def partition_rules(schema: Schema) -> Rules:
  """Path-regex partition rules (``specjax.parallel``) for every sharded weight of ``schema``."""
  return tuple((rf"(^|/){p.name}$", p.spec) for p in schema if p.spec != P())


def checkpoint_names(schema: Schema, cfg, num_layers: int, fmt: str) -> dict[str, tuple]:
  """``{tensor name in a ``fmt`` ('gguf' or 'hf') checkpoint: params path}``."""
  out = {}
  for path, p in entries(schema, cfg, num_layers):
    name = getattr(p, fmt)
    if name is None:
      raise ValueError(f"{p.name} has no {fmt} name in the schema.")
    out[name.format(i=path[1]) if p.per_layer else name] = path
  return out


def _leaves(params) -> Iterator[tuple[tuple, Any]]:
  for k, v in params.items():
    if k == "layers":
      for i, layer in enumerate(v):
        for name, leaf in layer.items():
          yield ("layers", i, name), leaf
    else:
      yield (k,), v


def _name(path: tuple) -> str:
  return f"layers[{path[1]}].{path[2]}" if path[0] == "layers" else path[0]
