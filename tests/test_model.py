"""models/: incremental decoding = a full forward, tree masks, blocks, windows, schema."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from specjax.models import llama, schema, tiny
from specjax.models.config import ModelConfig


@pytest.fixture(scope="module", params=["tied", "qwen2-style"])
def model(request):
  if request.param == "tied":
    return tiny.random_model(seed=0, vocab_size=32, dim=32, tie_embeddings=True)
  return tiny.random_model(
    seed=0, vocab_size=32, dim=32, num_heads=4, num_kv_heads=2, qkv_bias=True, rope_theta=1e6
  )


# Forwards run jitted, as decoding runs them: op by op, one test compiled ~300 small programs.
_forward = jax.jit(llama.forward, static_argnames=("cfg", "features", "window"))
_forward_kv = jax.jit(llama.forward_kv, static_argnames=("cfg", "features", "window"))


def _full(params, cfg, tokens_BxT):
  b, t = tokens_BxT.shape
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  return _forward(
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
  _, _, cache = _forward(params, cfg, tokens[:, :6], pos, cache, llama.causal_mask(6))
  cache = cache.replace(lengths=jnp.array([6, 3]))
  chunk = jnp.stack([tokens[0, 6:9], tokens[1, 3:6]])
  pos = cache.lengths[:, None] + jnp.arange(3)
  logits, _, _ = _forward(params, cfg, chunk, pos, cache, llama.causal_mask(3))
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
  _, _, cache = _forward(params, cfg, prefix, pos, cache, llama.causal_mask(3))
  cache = cache.replace(lengths=jnp.array([3]))
  nodes = jnp.array([a + b])
  tree_logits, _, _ = _forward(params, cfg, nodes, jnp.array([[3, 4, 3, 4]]), cache, tree_mask)
  for branch, sl in ((a, slice(0, 2)), (b, slice(2, 4))):
    chain, _, _ = _full(params, cfg, jnp.concatenate([prefix, jnp.array([branch])], axis=1))
    np.testing.assert_allclose(tree_logits[0, sl], chain[0, 3:5], atol=1e-5)


def test_features_are_the_residual_stream_and_final_state(model):
  cfg, params = model
  tokens = jnp.array([[1, 2, 3]])
  logits, (last, final, first), _ = llama.forward(
    params,
    cfg,
    tokens,
    jnp.arange(3)[None],
    llama.init_cache(cfg, 1, 4),
    llama.causal_mask(3),
    features=(cfg.num_layers - 1, "final", 0),
  )
  assert final.shape == first.shape == (1, 3, cfg.dim)
  np.testing.assert_allclose(
    final, llama.rms_norm(last, params["final_norm"], cfg.norm_eps), atol=1e-6
  )
  np.testing.assert_allclose(logits, llama.head(params, cfg, final), atol=1e-6)
  with pytest.raises(ValueError, match="layer index"):
    llama.check_features(cfg, (cfg.num_layers,))


@pytest.mark.parametrize("write", [True, False], ids=["write_then_read", "read_only"])
def test_forward_is_the_composition_of_public_blocks(model, write):
  """embed -> block per layer -> final_norm -> head, called by hand, is forward (writing the
  cache as it goes) and forward_kv (reading it, the new K/V kept apart), on a filled prefix."""
  cfg, params = model
  tokens = jnp.array([[4, 1, 7, 2], [3, 3, 0, 9]])
  cache = llama.init_cache(cfg, 2, 12)
  _, _, cache = llama.forward(
    params, cfg, tokens, jnp.broadcast_to(jnp.arange(4), (2, 4)), cache, llama.causal_mask(4)
  )
  cache = cache.replace(lengths=jnp.array([4, 2]))  # row 1 keeps only 2 prefix tokens
  pos = cache.lengths[:, None] + jnp.arange(3)
  new = jnp.array([[5, 6, 7], [8, 9, 1]])
  want, _, want_cache = llama.forward(params, cfg, new, pos, cache, llama.causal_mask(3))
  kv_logits, _, new_kv = llama.forward_kv(params, cfg, new, pos, cache, llama.causal_mask(3))
  np.testing.assert_allclose(kv_logits, want, atol=1e-5)
  attn = llama.attention_inputs(cache.lengths, llama.causal_mask(3), cache.num_slots, write=write)
  x = llama.embed(params, cfg, new)
  for i, p in enumerate(params["layers"]):
    x, k_i, v_i = llama.block(p, cfg, x, pos, cache.k[i], cache.v[i], attn)
    if write:
      np.testing.assert_array_equal(k_i, want_cache.k[i])
    else:
      np.testing.assert_allclose(k_i, new_kv.k[i], atol=1e-6)
      np.testing.assert_allclose(llama.write_kv(cache, new_kv).v[i], want_cache.v[i], atol=1e-6)
  got = llama.head(params, cfg, llama.final_norm(params, cfg, x))
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_attention_window_follows_the_live_length(model):
  """A cache of 1000 slots reads the smallest window that holds every row's prefix, and gives
  the same logits as a cache just big enough."""
  cfg, params = model
  assert llama.window_sizes(1000) == (128, 256, 1000)
  assert llama.window_sizes(1024) == (128, 256, 512, 1024)
  assert llama.window_sizes(100) == (100,)
  for lengths, write, window in (
    ([3, 124], True, 0),  # writing first: the window holds the prefix and the 4 new tokens
    ([3, 125], True, 1),
    ([3, 128], False, 0),  # reading only: the prefix alone
    ([3, 129], False, 1),
    ([600, 2], False, 2),
  ):
    mask = llama.causal_mask(4)
    attn = llama.attention_inputs(jnp.array(lengths), mask, 1000, write=write)
    assert int(attn.window) == window, (lengths, write)
  tokens = jax.random.randint(jax.random.key(2), (2, 140), 0, cfg.vocab_size)
  small, _, _ = _full(params, cfg, tokens)  # 148 slots: one window
  pos = jnp.broadcast_to(jnp.arange(140), (2, 140))
  cache = llama.init_cache(cfg, 2, 1000)
  big, _, cache = _forward(
    params, cfg, tokens[:, :130], pos[:, :130], cache, llama.causal_mask(130)
  )
  cache = cache.replace(lengths=jnp.array([130, 130]))
  step, _, _ = _forward(params, cfg, tokens[:, 130:], pos[:, 130:], cache, llama.causal_mask(10))
  kv_step, _, _ = _forward_kv(
    params, cfg, tokens[:, 130:], pos[:, 130:], cache, llama.causal_mask(10)
  )
  np.testing.assert_allclose(big, small[:, :130], atol=1e-5)
  np.testing.assert_allclose(step, small[:, 130:], atol=1e-5)
  np.testing.assert_allclose(kv_step, small[:, 130:], atol=1e-5)


def test_schema_drives_init_checks_rules_and_names(model):
  cfg, params = model
  llama.check_params(cfg, params)
  with pytest.raises(ValueError, match="1 layers but"):
    llama.check_params(cfg, dict(params, layers=params["layers"][:1]))
  bad = dict(
    params, layers=(dict(params["layers"][0], wq=params["layers"][0]["wk"]),) + params["layers"][1:]
  )
  with pytest.raises(ValueError, match=r"layers\[0\]\.wq has shape"):
    llama.check_params(cfg, bad)
  names = schema.checkpoint_names(llama.SCHEMA, cfg, cfg.num_layers, "hf")
  assert names["model.layers.1.self_attn.q_proj.weight"] == ("layers", 1, "wq")
  assert ("lm_head" in params) == ("lm_head.weight" in names) == (not cfg.tie_embeddings)
  assert ("bq" in params["layers"][0]) == cfg.qkv_bias
  gguf = schema.checkpoint_names(llama.SCHEMA, cfg, cfg.num_layers, "gguf")
  assert gguf["blk.0.ffn_down.weight"] == ("layers", 0, "w_down")
  rules = dict(llama.RULES)
  assert rules[r"(^|/)wo$"] == P("fsdp", "tensor") and rules[r"(^|/)embed$"] == P("tensor", "fsdp")
  assert not any("norm" in pattern for pattern in rules)
  # The shapes read off the schema (what build.check sizes memory by) are init's own.
  for c in (cfg, dataclasses.replace(cfg, qkv_bias=True, tie_embeddings=False)):
    for dtype in (jnp.float32, jnp.bfloat16):
      want = jax.eval_shape(
        lambda c=c, dtype=dtype: llama.init_params(c, jax.random.key(0), dtype=dtype)
      )
      assert llama.param_shapes(c, dtype) == want


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
