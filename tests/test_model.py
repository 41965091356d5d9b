"""models/: incremental decoding equals a full forward, arbitrary masks, cache compaction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import testing
from specjax.models import cache as kv
from specjax.models import llama
from specjax.models.config import ModelConfig


@pytest.fixture(scope="module", params=["tied", "qwen2-style"])
def model(request):
  if request.param == "tied":
    return testing.tiny_model(seed=0, vocab_size=32, dim=32, tie_embeddings=True)
  return testing.tiny_model(
    seed=0, vocab_size=32, dim=32, num_heads=4, num_kv_heads=2, qkv_bias=True, rope_theta=1e6
  )


def _full(params, cfg, tokens_BxT):
  b, t = tokens_BxT.shape
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  return llama.forward(
    params, cfg, tokens_BxT, pos, llama.init_cache(cfg, b, t + 8), llama.causal_mask(t)
  )


def test_incremental_equals_full_with_per_row_lengths(model):
  """Rows at different lengths, each fed chunks at its own offset, match the full forward."""
  cfg, params = model
  tokens = jax.random.randint(jax.random.key(1), (2, 10), 0, cfg.vocab_size)
  full_logits, _, _ = _full(params, cfg, tokens)
  cache = llama.init_cache(cfg, 2, 16)
  # Row 0 is prefilled with 6 tokens, row 1 with 3; garbage past each row's length.
  pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
  _, _, cache = llama.forward(params, cfg, tokens[:, :6], pos, cache, llama.causal_mask(6))
  cache = cache.replace(lengths=jnp.array([6, 3]))
  chunk = jnp.stack([tokens[0, 6:9], tokens[1, 3:6]])
  pos = cache.lengths[:, None] + jnp.arange(3)
  logits, _, _ = llama.forward(params, cfg, chunk, pos, cache, llama.causal_mask(3))
  np.testing.assert_allclose(logits[0], full_logits[0, 6:9], atol=1e-5)
  np.testing.assert_allclose(logits[1], full_logits[1, 3:6], atol=1e-5)


def test_tree_mask_equals_separate_branches(model):
  """Two branches verified together under an ancestor mask give each branch's chain logits."""
  cfg, params = model
  prefix = jnp.array([[3, 1, 4]])
  a, b = [5, 9], [2, 6]
  # Nodes: a0 a1 b0 b1 (a1's parent a0, b1's parent b0), positions = depth.
  tree_mask = jnp.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], bool)
  cache = llama.init_cache(cfg, 1, 16)
  pos = jnp.arange(3)[None]
  _, _, cache = llama.forward(params, cfg, prefix, pos, cache, llama.causal_mask(3))
  cache = cache.replace(lengths=jnp.array([3]))
  nodes = jnp.array([a + b])
  tree_logits, _, _ = llama.forward(params, cfg, nodes, jnp.array([[3, 4, 3, 4]]), cache, tree_mask)
  for branch, sl in ((a, slice(0, 2)), (b, slice(2, 4))):
    chain, _, _ = _full(params, cfg, jnp.concatenate([prefix, jnp.array([branch])], axis=1))
    np.testing.assert_allclose(tree_logits[0, sl], chain[0, 3:5], atol=1e-5)


def test_compact_moves_an_accepted_path_into_contiguous_slots(model):
  cfg, params = model
  cache = llama.init_cache(cfg, 2, 8)
  marks = jnp.arange(8, dtype=jnp.float32)[None, None, :, None]
  cache = cache.replace(k=tuple(jnp.broadcast_to(marks, c.shape) for c in cache.k))
  out = kv.compact(cache, jnp.array([[4, 6], [2, 3]]), jnp.array([2, 2]))
  np.testing.assert_array_equal(out.k[0][0, 0, :5, 0], [0, 1, 4, 6, 4])
  np.testing.assert_array_equal(out.k[0][1, 0, :5, 0], [0, 1, 2, 3, 4])


def test_capture_layers_returns_residual_stream(model):
  cfg, params = model
  tokens = jnp.array([[1, 2, 3]])
  _, hidden, _ = llama.forward(
    params,
    cfg,
    tokens,
    jnp.arange(3)[None],
    llama.init_cache(cfg, 1, 4),
    llama.causal_mask(3),
    capture_layers=(0, cfg.num_layers - 1),
  )
  assert len(hidden.layers) == 2 and hidden.final.shape == (1, 3, cfg.dim)
  expect = llama.rms_norm(hidden.layers[-1], params["final_norm"], cfg.norm_eps)
  np.testing.assert_allclose(hidden.final, expect, atol=1e-6)


@pytest.mark.parametrize(
  "kw, field",
  [
    (dict(num_heads=3, num_kv_heads=2), "num_kv_heads"),
    (dict(dim=0), "dim"),
    (dict(dim=30, num_heads=4, num_kv_heads=4), "head_dim"),
  ],
)
def test_bad_model_config(kw, field):
  base = dict(vocab_size=8, dim=16, num_layers=1, num_heads=2, num_kv_heads=1, ffn_dim=8)
  with pytest.raises(ValueError, match=field):
    ModelConfig(**(base | kw))
