"""Do a T-token verify's rows equal one-token AR steps bit for bit? Where do they first differ?

    python experiments/verify_cost/row_invariance.py     # ~6 min on 2 cores: SmolLM2, both dtypes

From one prefilled cache, AR runs 12 greedy one-token steps; a verify runs the same 12 tokens as
one causal forward. For each dtype it counts the verify rows whose logits equal the AR step's
exactly, and finds the first layer (and part: attention or MLP) whose output differs for the
first row: with the one-row products as specjax computes them; with every one-row product
padded to two rows (the row form a verify uses); with attention's softmax also computed on
at least 16 rows; and with every AR step run at the verify's 12 rows (its token in row 0),
so that every forward has one shape. Beside that, on random inputs: which row counts of a
product, of a softmax and its exponentials and of an RMS norm give the same rows as a 36-row
call. Writes ``results/row_invariance.json``."""

import json
import math
import os
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import llama, registry

HERE = Path(__file__).parent
TEXT = "The quick brown fox jumps over the lazy dog. In the beginning God created the heaven"
T, SLOTS = 12, 256
_linear = llama.linear


def _padded(x, w):
  """``llama.linear`` with a one-row product computed as a two-row one (a zero second row)."""
  if math.prod(x.shape[:-1]) != 1:
    return _linear(x, w)
  row = jnp.concatenate([x.reshape(1, -1), jnp.zeros((1, x.shape[-1]), x.dtype)])
  return _linear(row, w)[:1].reshape(*x.shape[:-1], -1)


def _first_part(params, cfg, layer, x_ar, x_verify, positions, cache):
  """The first of the layer's stages (attention output, MLP output) that differs for row 0."""
  p = params["layers"][layer]

  def stages(x, pos, mask):
    attn = llama.attention_inputs(cache.lengths, mask, cache.num_slots)
    h = llama.rms_norm(x, p["attn_norm"], cfg.norm_eps)
    a, _, _ = llama.attention(p, cfg, h, pos, cache.k[layer], cache.v[layer], attn)
    return a, llama.mlp(p, cfg, llama.rms_norm(x + a, p["mlp_norm"], cfg.norm_eps))

  one = jax.jit(stages)(x_ar, positions[:, :1], llama.causal_mask(1))
  many = jax.jit(stages)(x_verify, positions, llama.causal_mask(T))
  for name, u, v in zip(("attention", "mlp"), one, many, strict=True):
    if not np.array_equal(np.asarray(u[0, 0]), np.asarray(v[0, 0])):
      return name
  return None


def measure(dtype, pad: bool, pad_softmax: bool = False) -> dict:
  llama.linear = _padded if pad else _linear
  softmax = jax.nn.softmax
  if pad_softmax:  # attention's softmax on at least 16 rows, as a verify's is
    jax.nn.softmax = lambda x, axis=-1: _padded_softmax(x)  # llama's softmaxes are over axis -1
  try:
    cfg, params, tokenizer = registry.load("smollm2-135m-instruct")
    params = llama.cast(params, dtype)
    ids = tokenizer.encode(TEXT)
    n = len(ids)
    run = jax.jit(lambda p, *a: llama.forward(p, cfg, *a), static_argnums=5)
    fwd = lambda t, pos, c, mask, f=(): run(params, t, pos, c, mask, f)  # noqa: E731
    logits, _, cache = fwd(jnp.asarray([ids]), jnp.arange(n)[None], llama.init_cache(
      cfg, 1, SLOTS, dtype), llama.causal_mask(n))  # fmt: skip
    start = cache.replace(lengths=cache.lengths + n)
    tokens, ar, c = [int(jnp.argmax(logits[0, -1]))], [], start
    for j in range(T):
      step, _, c = fwd(jnp.asarray([[tokens[-1]]]), jnp.asarray([[n + j]]), c, llama.causal_mask(1))
      c = c.replace(lengths=c.lengths + 1)
      ar.append(np.asarray(step[0, 0]))
      tokens.append(int(jnp.argmax(step[0, 0])))
    chain, positions = jnp.asarray([tokens[:T]]), (n + jnp.arange(T))[None]
    verify = np.asarray(fwd(chain, positions, start, llama.causal_mask(T))[0][0])
    layers = tuple(range(cfg.num_layers))
    _, f1, _ = fwd(chain[:, :1], positions[:, :1], start, llama.causal_mask(1), layers)
    _, fT, _ = fwd(chain, positions, start, llama.causal_mask(T), layers)
    differ = [i for i in layers if not np.array_equal(np.asarray(f1[i][0, 0]), fT[i][0, 0])]
    first = differ[0] if differ else None
    part = None
    if first is not None:
      before = f1[first - 1] if first else llama.embed(params, cfg, chain[:, :1])
      before_T = fT[first - 1] if first else llama.embed(params, cfg, chain)
      part = _first_part(params, cfg, first, before, before_T, positions, start)
    return {
      "dtype": jnp.dtype(dtype).name, "one_row_padded": pad, "softmax_padded": pad_softmax,
      "rows_bit_identical": sum(np.array_equal(verify[j], ar[j]) for j in range(T)), "rows": T,
      "max_logit_difference": float(max(np.abs(verify[j] - ar[j]).max() for j in range(T))),
      "first_layer_differing": first, "first_part_differing": part,
    }  # fmt: skip
  finally:
    llama.linear, jax.nn.softmax = _linear, softmax


def measure_at_verify_rows(dtype) -> dict:
  """AR steps run at the verify's row count: each step's token in row 0 of a T-row causal
  forward (rows 1.. are filler, written past the committed length and overwritten by the next
  step), so every forward of the run has one shape. Counts the verify rows equal to the AR
  steps' row 0."""
  cfg, params, tokenizer = registry.load("smollm2-135m-instruct")
  params = llama.cast(params, dtype)
  ids = tokenizer.encode(TEXT)
  n = len(ids)
  run = jax.jit(lambda p, *a: llama.forward(p, cfg, *a))
  fwd = lambda t, pos, c, mask: run(params, t, pos, c, mask)  # noqa: E731
  cache = llama.init_cache(cfg, 1, SLOTS, dtype)
  logits, _, cache = fwd(jnp.asarray([ids]), jnp.arange(n)[None], cache, llama.causal_mask(n))
  start = cache.replace(lengths=cache.lengths + n)
  tokens, ar, c = [int(jnp.argmax(logits[0, -1]))], [], start
  for j in range(T):
    row = jnp.asarray([[tokens[-1]] + [0] * (T - 1)])
    step, _, c = fwd(row, (n + j + jnp.arange(T))[None], c, llama.causal_mask(T))
    c = c.replace(lengths=c.lengths + 1)
    ar.append(np.asarray(step[0, 0]))
    tokens.append(int(jnp.argmax(step[0, 0])))
  chain, positions = jnp.asarray([tokens[:T]]), (n + jnp.arange(T))[None]
  verify = np.asarray(fwd(chain, positions, start, llama.causal_mask(T))[0][0])
  return {
    "dtype": jnp.dtype(dtype).name, "ar_rows": T, "rows": T,
    "rows_bit_identical": sum(np.array_equal(verify[j], ar[j]) for j in range(T)),
    "max_logit_difference": float(max(np.abs(verify[j] - ar[j]).max() for j in range(T))),
  }  # fmt: skip


def product_rows(dtype) -> dict:
  """Whether a [576 -> 1536] product's rows equal those of a 16-row product, per row count."""
  w = jax.random.normal(jax.random.key(0), (1536, 576)).astype(dtype)
  x = jax.random.normal(jax.random.key(1), (16, 576)).astype(dtype)
  full = np.asarray(jax.jit(_linear)(x, w))
  return {m: bool(np.array_equal(jax.jit(_linear)(x[:m], w), full[:m])) for m in (1, 2, 4, 8, 12)}


def _padded_softmax(x, least: int = 16, softmax=jax.nn.softmax):
  """Softmax over the last axis, computed on at least ``least`` rows (zero rows added)."""
  m = x.shape[-2]
  pad = jnp.zeros((*x.shape[:-2], max(least - m, 0), x.shape[-1]), x.dtype)
  return softmax(jnp.concatenate([x, pad], -2), -1)[..., :m, :]


def op_rows() -> dict:
  """Per operation, the elements that differ from the same rows of a 36-row call (random
  inputs shaped as SmolLM2's: [1, 3, rows, 128] attention scores, [1, rows, 576] norm inputs),
  per row count."""
  s = np.asarray(jax.random.normal(jax.random.key(0), (1, 3, 36, 128)) * 3 - 5)
  h = np.asarray(jax.random.normal(jax.random.key(1), (1, 36, 576)) * 3)
  ops = {
    "exp(s - max s)": (lambda x: jnp.exp(x - x.max(-1, keepdims=True)), s, 2),
    "exp(s)": (jnp.exp, s, 2),
    "softmax": (lambda x: jax.nn.softmax(x, -1), s, 2),
    "softmax on >= 16 rows": (_padded_softmax, s, 2),
    "rms_norm": (lambda x: x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5), h, 1),
  }
  out = {}
  for name, (f, x, axis) in ops.items():
    full = np.asarray(jax.jit(f)(x))
    rows = lambda a, m, axis=axis: np.take(a, np.arange(m), axis=axis)  # noqa: E731
    out[name] = {m: int((np.asarray(jax.jit(f)(rows(x, m))) != rows(full, m)).sum())
                 for m in (1, 2, 3, 4, 12)}  # fmt: skip
  return out


def main() -> None:
  products = {jnp.dtype(d).name: product_rows(d) for d in (jnp.float32, jnp.bfloat16)}
  print("rows equal to a 16-row product's, by row count:", products)
  ops = op_rows()
  print("elements differing from a 36-row call's, by row count:", ops)
  rows = [measure(d, pad) for d in (jnp.float32, jnp.bfloat16) for pad in (False, True)]
  rows += [measure(d, True, pad_softmax=True) for d in (jnp.float32, jnp.bfloat16)]
  for r in rows:
    print(r)
  one_shape = [measure_at_verify_rows(d) for d in (jnp.float32, jnp.bfloat16)]
  for r in one_shape:
    print("AR steps at the verify's rows:", r)
  out = HERE / "results" / "row_invariance.json"
  fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
  with os.fdopen(fd, "w") as f:
    record = {
      "products": products, "ops": ops, "rows": rows, "ar_at_verify_rows": one_shape,
      "jax": jax.__version__,
    }  # fmt: skip
    json.dump(record, f, indent=1)
  os.replace(tmp, out)


if __name__ == "__main__":
  main()
