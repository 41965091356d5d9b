"""KVCache: static per-layer key/value buffers with per-row lengths.

Each layer holds ``k, v: [B, S, G, Dh]``; ``lengths[B]`` says how many leading slots of a row
are committed. A forward writes its T new entries at slots ``lengths[b] .. lengths[b]+T-1``
without moving ``lengths``; the decode loop commits by advancing ``lengths``. Rolling back a
rejected draft is therefore free: slots at or past a row's length are masked out and later
overwritten.

Layers are a tuple of arrays rather than one stacked ``[L, B, S, G, Dh]`` array so that a layer
reads and writes its own buffer with no slice copy of the stack.
"""

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class KVCache:
  k: tuple[jax.Array, ...]  # L x [B, S, G, Dh]
  v: tuple[jax.Array, ...]  # L x [B, S, G, Dh]
  lengths: jax.Array  # [B] int32: committed slots per row.

  @property
  def num_slots(self) -> int:
    return self.k[0].shape[1]

  @classmethod
  def zeros(cls, num_layers, batch, num_slots, num_kv_heads, head_dim, dtype=jnp.float32):
    shape = (batch, num_slots, num_kv_heads, head_dim)
    return cls(
        k=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
        v=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
        lengths=jnp.zeros((batch,), jnp.int32),
    )


def write_rows(buf: jax.Array, new: jax.Array, offsets: jax.Array) -> jax.Array:
  """Writes ``new[b]`` ([T, ...]) into ``buf[b]`` ([S, ...]) at slot ``offsets[b]``, per row."""

  def one(row, upd, off):
    start = (off,) + (0,) * (row.ndim - 1)
    return jax.lax.dynamic_update_slice(row, upd.astype(row.dtype), start)

  return jax.vmap(one)(buf, new, offsets)


def gather_rows(buf: jax.Array, index_BxT: jax.Array) -> jax.Array:
  """Returns ``buf[b, index[b, t]]`` for every row b and t: ``[B, T, ...]``."""
  return jax.vmap(lambda row, idx: row[idx])(buf, index_BxT)


def compact(cache: KVCache, src_BxT: jax.Array, dst_offsets_B: jax.Array) -> KVCache:
  """Copies slots ``src[b, :]`` of every layer to contiguous slots starting at ``dst_offsets[b]``.

  Used after tree verification: the accepted root-to-leaf path, scattered across the verified
  nodes' slots, is moved into the slots right after the committed prefix. ``lengths`` is not
  changed; the caller commits.
  """
  move = lambda buf: write_rows(buf, gather_rows(buf, src_BxT), dst_offsets_B)
  return cache.replace(k=tuple(map(move, cache.k)), v=tuple(map(move, cache.v)))
