"""Published EAGLE drafters (SafeAILab, SpecForge, vLLM speculators) in, specjax drafters out:
checked against the reference code itself.

Oracles (``scripts/install_oracles.sh``): eagle-llm's ``eagle.model.cnets.Model`` (EAGLE-1/2),
and speculators, imported as a user imports it: the ``Eagle3DraftModel`` of
``models/eagle3/core.py`` (the speculators layout, run through its own
forward) and ``convert/eagle/eagle3_legacy_model.py`` (the SafeAILab EAGLE-3 layer, saved under
SafeAILab's ``midlayer.`` names). Each builds a drafter with random weights over a tiny random
target whose configs are transformers' own classes; the drafter saved by the reference code
loads into specjax, and for the same tokens and target features its hidden states and logits
match the reference forward to 1e-4 (fp32); with one weight transposed in the file they do not.
"""

import dataclasses
import functools
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("eagle.model.cnets")

from safetensors.numpy import load_file, save_file  # noqa: E402

from specjax import testing  # noqa: E402
from specjax.decode import generate  # noqa: E402
from specjax.drafters import eagle  # noqa: E402
from specjax.drafters.eagle import formats as interop  # noqa: E402
from specjax.models import checkpoint, llama, source  # noqa: E402
from specjax.testing import P_FAIL, P_PASS  # noqa: E402

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13]]
SEQ = [3, 9, 4, 17, 5, 8, 30, 2, 22, 41, 7, 63, 1, 12]  # t_0 .. t_S: pairs (f_i, t_{i+1})
F, HEADS, KV, FFN = 32, 4, 2, 48


# --- targets: transformers' config classes -> specjax ------------------------------------------


def _target(family="llama", layers=8, vocab=64, seed=0) -> source.Model:
  """A random target whose config is a transformers LlamaConfig / Qwen2Config."""
  cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[family]
  hf = cls(vocab_size=vocab, hidden_size=F, intermediate_size=64, num_hidden_layers=layers,
           num_attention_heads=HEADS, num_key_value_heads=KV, rms_norm_eps=1e-5,
           tie_word_embeddings=False, max_position_embeddings=256)  # fmt: skip
  d = hf.to_dict() | {"architectures": [cls.__name__.replace("Config", "ForCausalLM")]}
  cfg = dataclasses.replace(checkpoint._hf_config(d), name=f"tiny-{family}")
  params = llama.init_params(cfg, jax.random.key(seed), embed_std=1.5 / F**0.5)
  return source.Model(cfg, params)


def _features(target, feature_layers, seq=SEQ):
  """``(next tokens [1, S], features [1, S, n*F])`` of the pairs of ``seq``."""
  tokens = jnp.asarray([seq])
  _, feats = llama.logits_of(target.params, target.cfg, tokens, tuple(feature_layers))
  return tokens[:, 1:], jnp.concatenate(feats, axis=-1)[:, :-1]


@functools.partial(jax.jit, static_argnums=0)
def _specjax_forward(cfg, params, next_1xT, feats_1xTxFin):
  """The drafter over the pairs with no cache: ``(out [1, T, F], logits [1, T, V'])``."""
  t = next_1xT.shape[1]
  attn = llama.attention_inputs(jnp.zeros((1,), jnp.int32), llama.causal_mask(t), 0, 0, False)
  x = eagle.inputs(params, cfg, next_1xT, eagle.fuse(params, feats_1xTxFin))
  out, _, _ = eagle.layer(params, cfg, x, jnp.arange(t)[None], None, None, attn)
  return out, eagle.logits(params, cfg, out)


def _t(x):
  return torch.from_numpy(np.asarray(x, np.float32))


def _layer_config(target, **kw):
  c = transformers.LlamaConfig(
    vocab_size=target.cfg.vocab_size, hidden_size=F, intermediate_size=FFN, num_hidden_layers=1,
    num_attention_heads=HEADS, num_key_value_heads=KV, rms_norm_eps=1e-6, rope_theta=5e5,
    max_position_embeddings=256, tie_word_embeddings=False, **kw,
  )  # fmt: skip
  c._attn_implementation = "eager"
  return c


def _randomize(module, seed):
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in module.named_parameters():
      if name.endswith("norm.weight") or "layernorm" in name:
        p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
      else:
        p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)


# --- the oracles -------------------------------------------------------------------------------


def _eagle1_reference(target, directory, bias=True, qkv_bias=False, seed=1):
  """eagle-llm's EAGLE-1/2 ``Model`` with random weights, saved as SafeAILab publishes it
  (config.json with ``bias`` / ``qkv_bias``, the state dict); returns the module."""
  from eagle.model import cnets

  config = _layer_config(target)
  config.rope_scaling = None  # transformers 5 fills a dict the 2024 code reads as ["type"]
  # (That drops rope_parameters too: eagle-llm 1.2.1's EAGLE-1 layer always rotates with
  # base 10,000, and the config then names none.)
  torch.manual_seed(seed)
  m = cnets.Model(config, bias=bias).eval()
  if qkv_bias:  # SafeAILab's current cnets1.py: q/k/v biases when the config has qkv_bias
    attn = m.layers[0].self_attn
    for name in ("q_proj", "k_proj", "v_proj"):
      old = getattr(attn, name)
      setattr(attn, name, torch.nn.Linear(old.in_features, old.out_features, bias=True))
  _randomize(m, seed)
  with torch.no_grad():
    m.embed_tokens.weight.copy_(_t(target.params["embed"]))
  directory.mkdir(parents=True, exist_ok=True)
  cfg = config.to_dict() | {"architectures": ["LlamaForCausalLM"], "bias": bias}
  if qkv_bias:
    cfg["qkv_bias"] = True
  (directory / "config.json").write_text(json.dumps(cfg))
  save_file({k: v.numpy() for k, v in m.state_dict().items()}, str(directory / "model.safetensors"))
  return m


def _eagle1_forward(m, target, next_1xT, feats):
  with torch.no_grad():
    out = m(_t(feats), torch.from_numpy(np.asarray(next_1xT)).long())
  head = _t(target.params["lm_head"])
  return out.numpy(), (out @ head.T).numpy()


def _speculators():
  """speculators' EAGLE-3 model module, imported through its package as a user imports it."""
  pytest.importorskip("speculators", reason="bash scripts/install_oracles.sh installs it")
  from speculators.models.eagle3 import core

  return core


def _speculators_config(target, ids, aux, layer=None):
  _speculators()
  from speculators.config import SpeculatorsConfig, VerifierConfig
  from speculators.models.eagle3.config import Eagle3SpeculatorConfig
  from speculators.proposals.greedy import GreedyTokenProposalConfig

  spec = SpeculatorsConfig(
    algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
    default_proposal_method="greedy",
    verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
  )  # fmt: skip
  return Eagle3SpeculatorConfig(
    transformer_layer_config=layer or _layer_config(target), speculators_config=spec,
    draft_vocab_size=len(ids), eagle_aux_hidden_state_layer_ids=aux,
  )  # fmt: skip


def _vocab_maps(target, ids):
  ids = np.asarray(ids, np.int64)
  t2d = np.zeros((target.cfg.vocab_size,), bool)
  t2d[ids] = True
  return torch.from_numpy(ids - np.arange(len(ids))), torch.from_numpy(t2d)


def _eagle3_speculators(target, directory, ids, aux, seed=2):
  """speculators' ``Eagle3DraftModel`` with random weights, saved by its ``save_pretrained``."""
  core = _speculators()
  torch.manual_seed(seed)
  m = core.Eagle3DraftModel(_speculators_config(target, ids, aux)).eval()
  _randomize(m, seed)
  d2t, t2d = _vocab_maps(target, ids)
  with torch.no_grad():
    m.embed_tokens.weight.copy_(_t(target.params["embed"]))  # as load_verifier_weights does
    m.d2t.copy_(d2t)
    m.t2d.copy_(t2d)
  m.save_pretrained(str(directory))
  return m


def _eagle3_forward(m, next_1xT, feats):
  """speculators' own forward (one step over the teacher-forced pairs), its layer's output and
  its head's logits caught by hooks."""
  caught = {}
  hooks = [
    m.layers[0].register_forward_hook(lambda mod, i, o: caught.setdefault("out", o)),
    m.lm_head.register_forward_hook(lambda mod, i, o: caught.setdefault("logits", o)),
  ]
  t = next_1xT.shape[1]
  with torch.no_grad():
    m(_t(feats), torch.from_numpy(np.asarray(next_1xT)).long(),
      document_ids=torch.zeros((1, t), dtype=torch.long),
      position_ids=torch.arange(t)[None], ttt_steps=1)  # fmt: skip
  for h in hooks:
    h.remove()
  return caught["out"].numpy(), caught["logits"].numpy()


def _eagle3_legacy(target, directory, ids, seed=3, torch_pickle=False):
  """speculators' legacy ``Eagle3Speculator`` (the SafeAILab EAGLE-3 layer) with random
  weights, saved as SafeAILab publishes it: ``midlayer.*``, a flat config with
  ``draft_vocab_size`` and no auxiliary ids (the default rule)."""
  torch.manual_seed(seed)
  m = _legacy_module(_speculators_config(target, ids, None))
  _randomize(m, seed)
  d2t, t2d = _vocab_maps(target, ids)
  with torch.no_grad():
    m.embed_tokens.weight.copy_(_t(target.params["embed"]))
    m.d2t.copy_(d2t)
    m.t2d.copy_(t2d)
  directory.mkdir(parents=True, exist_ok=True)
  layer = _layer_config(target).to_dict()
  cfg = {k: layer[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                               "num_key_value_heads", "rms_norm_eps", "vocab_size",
                               "max_position_embeddings", "hidden_act")}  # fmt: skip
  cfg |= {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
          "num_hidden_layers": 1, "rope_theta": 5e5, "draft_vocab_size": len(ids),
          "tie_word_embeddings": False}  # fmt: skip
  (directory / "config.json").write_text(json.dumps(cfg))
  state = {k.replace("layers.0.", "midlayer."): v for k, v in m.state_dict().items()}
  if torch_pickle:
    torch.save(state, directory / "pytorch_model.bin")
  else:
    save_file({k: v.numpy() for k, v in state.items()}, str(directory / "model.safetensors"))
  return m


def _legacy_module(config):
  _speculators()
  from speculators.convert.eagle.eagle3_legacy_model import Eagle3Speculator

  return Eagle3Speculator(config, verifier=None, verifier_attachment_mode="detached").eval()


def _legacy_forward(m, next_1xT, feats):
  """SafeAILab's cnets forward over the legacy layer: fc(aux), [embed; fc(aux)] through the
  layer at positions 0.., lm_head(norm(out))."""
  rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(
    m.config.transformer_layer_config
  )
  t = next_1xT.shape[1]
  pos = torch.arange(t)[None]
  mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
  with torch.no_grad():
    e = m.embed_tokens(torch.from_numpy(np.asarray(next_1xT)).long())
    h = m.fc(_t(feats))
    # The layer hands position_ids on to transformers' apply_rotary_pos_emb as its fifth
    # argument, which transformers >= 4.48 names unsqueeze_dim; the positions themselves come in
    # position_embeddings, so that argument gets the value it defaults to.
    out = m.layers[0](torch.cat([e, h], -1), attention_mask=mask, position_ids=1,
                      position_embeddings=rotary(h, pos))[0]  # fmt: skip
    return out.numpy(), m.lm_head(m.norm(out)).numpy()


def _transposed(directory, name):
  """The drafter's file with one (square) weight transposed."""
  path = directory / "model.safetensors"
  tensors = load_file(str(path))
  assert tensors[name].shape[0] == tensors[name].shape[1], name
  tensors[name] = np.ascontiguousarray(tensors[name].T)
  save_file(tensors, str(path), metadata={"format": "pt"})


def _close(got, want):
  return np.allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


# --- published drafters load and compute what their reference code computes -------------------


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_eagle1_matches_its_reference_and_a_transposed_weight_does_not(tmp_path, family):
  """EAGLE-1/2 (SafeAILab): the drafter's output and the target head's logits over it equal
  eagle-llm's forward; Qwen2 drafters with q/k/v biases (SafeAILab's qkv_bias) too."""
  target = _target(family)
  qkv_bias = family == "qwen2"
  m = _eagle1_reference(target, tmp_path / "d", qkv_bias=qkv_bias)
  assert interop.detect(tmp_path / "d") == "eagle"
  cfg, params, meta = eagle.load(tmp_path / "d", target)
  assert (cfg.architecture, meta["format"], cfg.layer.qkv_bias) == ("eagle1", "eagle", qkv_bias)
  assert cfg.layer.rope_theta == 1e4 and cfg.layer.norm_eps == 1e-6 and cfg.mlp_width == FFN
  nxt, feats = _features(target, ("final",))
  out, logits = _specjax_forward(cfg, params, nxt, feats)
  want_out, want_logits = _eagle1_forward(m, target, nxt, feats)
  np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-4, atol=1e-4)
  _transposed(tmp_path / "d", "layers.0.self_attn.o_proj.weight")
  cfg, params, _ = eagle.load(tmp_path / "d", target)
  out, logits = _specjax_forward(cfg, params, nxt, feats)
  assert not _close(out, want_out) and not _close(logits, want_logits)


def test_speculators_eagle3_matches_its_reference_and_a_transposed_weight_does_not(tmp_path):
  """EAGLE-3 in vLLM speculators' layout (reduced vocabulary with d2t, explicit auxiliary
  layers) equals speculators' own forward; its auxiliary id a is the state fed into layer a."""
  target = _target(layers=4)
  ids = sorted({0, 5, 63, *range(7, 60, 3)})
  m = _eagle3_speculators(target, tmp_path / "d", ids, aux=[1, 2, 4])
  assert interop.detect(tmp_path / "d") == "speculators"
  cfg, params, meta = eagle.load(tmp_path / "d", target)
  assert cfg.architecture == "eagle3" and cfg.feature_layers == (0, 1, 3)
  assert params["vocab_ids"].tolist() == ids and cfg.draft_vocab == len(ids)
  nxt, feats = _features(target, cfg.feature_layers)
  out, logits = _specjax_forward(cfg, params, nxt, feats)
  want_out, want_logits = _eagle3_forward(m, nxt, feats)
  np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-4, atol=1e-4)
  _transposed(tmp_path / "d", "layers.0.self_attn.o_proj.weight")
  cfg, params, _ = eagle.load(tmp_path / "d", target)
  out, logits = _specjax_forward(cfg, params, nxt, feats)
  assert not _close(out, want_out) and not _close(logits, want_logits)


def test_auxiliary_layer_a_is_the_hidden_state_fed_into_layer_a(tmp_path):
  """transformers' ``output_hidden_states[a]`` (what speculators' data generation and vLLM
  capture as aux layer a) is specjax's feature a - 1; the last, L, is the final normed state
  in transformers (vLLM captures the un-normed residual there: specjax reads L - 1)."""
  target = _target(layers=4)
  hf = transformers.LlamaForCausalLM(_target_hf_config(target)).eval()
  state = {name: _t(np.asarray(v)) for name, v in _hf_state(target).items()}
  hf.load_state_dict(state, strict=False)
  with torch.no_grad():
    hs = hf(torch.tensor([SEQ]), output_hidden_states=True).hidden_states
  _, feats = llama.logits_of(target.params, target.cfg, jnp.asarray([SEQ]), (0, 1, 2, "final"))
  for a in (1, 2, 3):
    np.testing.assert_allclose(feats[a - 1], hs[a].numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(feats[3], hs[4].numpy(), rtol=1e-4, atol=1e-4)


def _target_hf_config(target):
  c = target.cfg
  return transformers.LlamaConfig(
    vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim,
    num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
    num_key_value_heads=c.num_kv_heads, rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
    tie_word_embeddings=False,
  )  # fmt: skip


def _hf_state(target):
  from specjax.models import schema

  c = target.cfg
  out = {}
  for path, p in schema.entries(llama.SCHEMA, c, c.num_layers):
    name = p.hf.format(i=path[1]) if path[0] == "layers" else p.hf
    out[name] = schema.lookup(target.params, path)
  return out


def test_safeailab_eagle3_matches_its_reference_with_the_default_layers(tmp_path):
  """EAGLE-3 in SafeAILab's layout (``midlayer.*``, no auxiliary ids: the default rule
  [2, L // 2, L - 3] of states fed into those layers), reduced vocabulary."""
  target = _target(layers=8)
  ids = sorted({1, 2, 40, *range(10, 64, 4)})
  m = _eagle3_legacy(target, tmp_path / "d", ids)
  assert interop.detect(tmp_path / "d") == "eagle3"
  cfg, params, _ = eagle.load(tmp_path / "d", target)
  assert cfg.feature_layers == (1, 3, 4)  # 2, 8 // 2, 8 - 3, minus one
  nxt, feats = _features(target, cfg.feature_layers)
  out, logits = _specjax_forward(cfg, params, nxt, feats)
  want_out, want_logits = _legacy_forward(m, nxt, feats)
  np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-4, atol=1e-4)
  _transposed(tmp_path / "d", "midlayer.self_attn.o_proj.weight")
  cfg, params, _ = eagle.load(tmp_path / "d", target)
  out, logits = _specjax_forward(cfg, params, nxt, feats)
  assert not _close(out, want_out) and not _close(logits, want_logits)


# --- export: the published layouts, read back by the reference code and by specjax ------------


def _trained(target, architecture, features=("final",), vocab_ids=None, seed=4):
  """A specjax drafter of a published architecture with random weights (fc's bias too)."""
  drafter, params = testing.eagle_drafter(
    (target.cfg, target.params), 3, 3, 8, vocab_ids, sampled=False, seed=seed,
    features=features, architecture=architecture,
  )  # fmt: skip
  if architecture == "eagle1":
    params["fc_b"] = 0.1 * jax.random.normal(jax.random.key(seed), params["fc_b"].shape)
  return drafter, params


EXPORTS = {
  "eagle1_as_eagle": ("eagle1", "eagle"),
  "eagle3_as_eagle3": ("eagle3", "eagle3"),
  "eagle3_as_speculators": ("eagle3", "speculators"),
}
REDUCED = tuple(sorted({0, 5, 63, *range(7, 60, 3)}))


@pytest.mark.parametrize("arch, fmt", EXPORTS.values(), ids=EXPORTS)
def test_export_then_import_is_bit_identical(tmp_path, arch, fmt):
  """float32 export -> import gives the same config and the same tensors bit for bit; the
  directory is written atomically and holds what vLLM and SGLang read."""
  target = _target()
  features, ids = ((1, 3, 4), REDUCED) if arch == "eagle3" else (("final",), None)
  drafter, params = _trained(target, arch, features, ids)
  verifier = "org/tiny-llama" if fmt == "speculators" else ""
  interop.export(drafter.cfg, params, tmp_path / "x", fmt, "float32", verifier)
  assert not list(tmp_path.glob(".*tmp"))
  assert interop.detect(tmp_path / "x") == fmt
  cfg, loaded, meta = eagle.load(tmp_path / "x", target)
  assert cfg == drafter.cfg and meta["format"] == fmt
  flat = lambda p: {jax.tree_util.keystr(k): np.asarray(v) for k, v in  # noqa: E731
                    jax.tree_util.tree_leaves_with_path(p)}  # fmt: skip
  want, got = flat(params), flat(loaded)
  assert want.keys() == got.keys()
  for k in want:
    assert want[k].dtype == got[k].dtype and np.array_equal(want[k], got[k]), k
  config = json.loads((tmp_path / "x" / "config.json").read_text())
  assert config.get("tie_word_embeddings") is False or "transformer_layer_config" in config
  if arch == "eagle3":
    assert config["draft_vocab_size"] == len(ids)
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # inputs of layers a
    if fmt == "eagle3":
      assert config["architectures"] == ["LlamaForCausalLMEagle3"]
      assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]


def test_a_bfloat16_export_holds_the_rounded_weights(tmp_path):
  target = _target()
  drafter, params = _trained(target, "eagle3", (1, 3, 4), REDUCED)
  interop.export(drafter.cfg, params, tmp_path / "x", "speculators", "bfloat16", "org/tiny-llama")
  tensors = load_file(str(tmp_path / "x" / "model.safetensors"))
  assert tensors["fc.weight"].dtype == jnp.bfloat16 and tensors["d2t"].dtype == np.int64
  _, loaded, _ = eagle.load(tmp_path / "x", target)
  rounded = np.asarray(params["fuse"]).astype(jnp.bfloat16).astype(np.float32)
  np.testing.assert_array_equal(loaded["fuse"], rounded)


def _verifier(tmp_path, target, name=""):
  """``target`` as an HF directory: what a user names as ``export.verifier``."""
  directory = tmp_path / (name or f"verifier_{target.cfg.name}")
  if not directory.is_dir():
    hf = transformers.LlamaForCausalLM(_target_hf_config(target))
    hf.load_state_dict({k: _t(v) for k, v in _hf_state(target).items()}, strict=False)
    hf.save_pretrained(directory)
  return directory


def _eagle_llm_reads(directory, target, nxt, feats):
  """eagle-llm 1.2.1 reads an ``eagle`` export as ``EaModel.from_pretrained`` reads the drafter:
  ``EConfig`` from config.json, ``cnets.Model(config, bias=config["bias"])``, ``torch.load`` of
  pytorch_model.bin, a strict load; logits of the target's head over its output."""
  from eagle.model import cnets
  from eagle.model.configs import EConfig

  config = EConfig.from_pretrained(str(directory / "config.json"))
  # transformers 5 fills rope_scaling with a dict that lacks the "type" key this 2024 layer
  # reads; None is its plain rotary (the exports here use no scaling).
  config.rope_scaling = None
  bias = json.loads((directory / "config.json").read_text()).get("bias", True)
  m = cnets.Model(config, bias=bias).eval()
  m.load_state_dict(torch.load(directory / "pytorch_model.bin", map_location="cpu"), strict=True)
  return _eagle1_forward(m, target, nxt, feats)[1]


def _sglang_reads(directory, target, nxt, feats):
  """SGLang's EAGLE-3 drafter as SpecForge (SGLang's trainer) defines it: built from config.json
  by transformers' ``LlamaConfig``, every tensor of model.safetensors loaded strictly under the
  names SGLang reads (``midlayer.*``, ``embed_tokens``, ``d2t``, ``t2d``); logits of its
  ``compute_logits`` over its ``backbone``. (Not its ``from_pretrained``: under transformers
  5.25, against the 5.8 it pins, that leaves the rotary tables, non-persistent buffers, empty.)"""
  from safetensors.torch import load_file as load_torch

  llama3_eagle = pytest.importorskip("specforge.modeling.draft.llama3_eagle")
  m = llama3_eagle.LlamaForCausalLMEagle3(transformers.LlamaConfig.from_pretrained(directory))
  m.load_state_dict(load_torch(directory / "model.safetensors"), strict=True)
  t = nxt.shape[1]
  with torch.no_grad():
    m.eval()
    embeds = m.embed_input_ids(torch.from_numpy(np.asarray(nxt)).long())
    out = m.backbone(embeds, m.project_hidden_states(_t(feats)), None, None, torch.arange(t)[None])
    logits = m.compute_logits(out).numpy()
  return logits, m.d2t.numpy() + np.arange(m.d2t.shape[0])


def _speculators_reads(directory, target, nxt, feats):
  """speculators' public ``from_pretrained`` (which also loads what it needs from the verifier
  the config names); logits of its own forward."""
  m = _speculators().Eagle3DraftModel.from_pretrained(str(directory)).eval()
  return _eagle3_forward(m, nxt, feats)[1], m.d2t.numpy() + np.arange(m.d2t.shape[0])


def _converter_reads(directory, target, nxt, feats):
  """speculators' converter for SafeAILab/SGLang EAGLE-3 checkpoints (``Eagle3Converter``, what
  ``speculators convert`` runs), given the verifier and the auxiliary layers the export's
  config names, as a user passes them; then its output read as a ``speculators`` export."""
  _speculators()
  from speculators.convert.eagle.eagle3_converter import Eagle3Converter

  aux = json.loads((directory / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"]
  out = directory.parent / f"{directory.name}_converted"
  Eagle3Converter().convert(directory, out, base_model=str(directory.parent / VERIFIER),
                            eagle_aux_hidden_state_layer_ids=aux)  # fmt: skip
  return _speculators_reads(out, target, nxt, feats)


def _without(directory, tensor=None, field=None):
  """The export with one tensor (from whichever weights file it has) or one config field gone."""
  if field:
    config = json.loads((directory / "config.json").read_text())
    config.pop(field)
    (directory / "config.json").write_text(json.dumps(config))
  if tensor and (directory / "model.safetensors").is_file():
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors[tensor]
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
  elif tensor:
    state = torch.load(directory / "pytorch_model.bin")
    del state[tensor]
    torch.save(state, directory / "pytorch_model.bin")


def _reads_the_same(read, directory, target, nxt, feats, want, ids=None) -> bool:
  """Whether ``read`` loads the directory and gives ``want`` (and the draft ids ``ids``)."""
  try:
    got = read(directory, target, nxt, feats)
  except (RuntimeError, ValueError, AttributeError, KeyError) as e:  # what the loaders raise
    print(f"{read.__name__}: {type(e).__name__}: {str(e)[:200]}")
    return False
  logits, got_ids = got if isinstance(got, tuple) else (got, None)
  return _close(logits, want) and (ids is None or np.array_equal(got_ids, ids))


EXPORT_READERS = {  # reader -> (format, architecture, reader, a config field the reader needs)
  "eagle-llm": ("eagle", "eagle1", _eagle_llm_reads, "hidden_size"),
  "sglang": ("eagle3", "eagle3", _sglang_reads, "draft_vocab_size"),
  "speculators_converter": ("eagle3", "eagle3", _converter_reads, "draft_vocab_size"),
  "speculators": ("speculators", "eagle3", _speculators_reads, "draft_vocab_size"),
}
VERIFIER = "verifier"  # the verifier's HF directory, beside the exports


@pytest.mark.parametrize(
  "reader",
  [pytest.param(r, marks=pytest.mark.slow) if r in ("speculators_converter", "sglang") else r
   for r in EXPORT_READERS],
)  # fmt: skip
def test_an_export_is_read_by_its_engines_own_loader(tmp_path, reader):
  """Each export, as written, read by the reference code of the engine it is for, with no help:
  it gives specjax's logits (1e-4, float32); without the embedding, or without a config field
  the reader needs, it does not (a load error or other logits)."""
  fmt, arch, read, field = EXPORT_READERS[reader]
  target = _target()
  features, ids = ((1, 3, 4), REDUCED) if arch == "eagle3" else (("final",), None)
  drafter, params = _trained(target, arch, features, ids)
  nxt, feats = _features(target, drafter.cfg.feature_layers)
  _, want = _specjax_forward(drafter.cfg, params, nxt, feats)
  # The verifier named has the target's shapes and other weights: what the loader computes must
  # come from the export itself. (speculators' loader fills a missing embedding from the
  # verifier, or leaves it as torch.empty's memory unless that holds a NaN: either way, not
  # the target's.)
  other = dataclasses.replace(_target(seed=12), cfg=dataclasses.replace(target.cfg, name="other"))
  verifier = str(_verifier(tmp_path, other, VERIFIER)) if arch == "eagle3" else ""
  for case, edit in [("no embedding", {"tensor": "embed_tokens.weight"}),
                     (f"no {field}", {"field": field}), ("as written", {})]:  # fmt: skip
    directory = tmp_path / case.replace(" ", "_")
    interop.export(drafter.cfg, params, directory, fmt, "float32",
                   verifier=verifier if fmt == "speculators" else "")  # fmt: skip
    _without(directory, **edit)
    assert _reads_the_same(read, directory, target, nxt, feats, want, ids) == (not edit), case


def eagle3_exports_match_their_references(tmp_path, target, cfg, params):
  """An EAGLE-3 drafter (``cfg``, decode ``params``, e.g. one trained here) exported for SGLang
  (``eagle3``, read by SGLang's model and by speculators' converter) and for vLLM
  (``speculators``, its verifier named) gives specjax's logits in the engines' own loaders."""
  nxt, feats = _features(target, cfg.feature_layers)
  _, want = _specjax_forward(cfg, params, nxt, feats)
  ids = np.asarray(params["vocab_ids"])
  verifier = str(_verifier(tmp_path, target, VERIFIER))
  for reader, (fmt, _, read, _) in EXPORT_READERS.items():
    if fmt in ("eagle3", "speculators"):
      out = tmp_path / reader
      interop.export(cfg, params, out, fmt, "float32",
                     verifier=verifier if fmt == "speculators" else "")  # fmt: skip
      assert _reads_the_same(read, out, target, nxt, feats, want, ids), reader


def test_speculators_holds_eagle3_only(tmp_path):
  """speculators >= 0.9 reads no EAGLE-1 type: such an export is refused, naming the layout
  that holds it."""
  target = _target()
  drafter, params = _trained(target, "eagle1")
  with pytest.raises(ValueError, match="format='eagle'"):
    interop.export(drafter.cfg, params, tmp_path / "x", "speculators")
  assert not (tmp_path / "x").exists()


def test_a_specjax_architecture_drafter_is_refused_by_every_layout(tmp_path):
  target = _target()
  drafter, params = testing.eagle_drafter((target.cfg, target.params), 2, 2, 3)
  for fmt in interop.EXPORTS:
    with pytest.raises(ValueError, match="architecture is 'specjax'"):
      interop.export(drafter.cfg, params, tmp_path / fmt, fmt)
  drafter, params = _trained(target, "eagle1")
  with pytest.raises(ValueError, match="architecture is 'eagle1'"):
    interop.export(drafter.cfg, params, tmp_path / "x", "eagle3")
  assert not list(tmp_path.iterdir())


# --- imported drafters decode losslessly ---------------------------------------------------


_GREEDY_TARGET = _target()


@functools.lru_cache(maxsize=1)
def _ar():
  t = _GREEDY_TARGET
  return generate(t.params, t.cfg, PROMPTS, max_new_tokens=24, max_len=48, eos_id=[5])


@pytest.mark.parametrize(
  "layout", ["eagle", "safeailab_eagle3", pytest.param("speculators", marks=pytest.mark.slow)]
)
def test_greedy_decoding_with_an_imported_drafter_equals_autoregressive(tmp_path, layout):
  """Batch 4, ragged prompts, a stop id, an EAGLE-2 tree: the tokens are AR's (SafeAILab's
  EAGLE-1 and EAGLE-3 layouts, speculators' EAGLE-3)."""
  target = _GREEDY_TARGET
  if layout == "eagle":
    _eagle1_reference(target, tmp_path / "d")
  elif layout == "safeailab_eagle3":
    _eagle3_legacy(target, tmp_path / "d", REDUCED)
  else:
    _eagle3_speculators(target, tmp_path / "d", REDUCED, aux=[1, 4, 8])
  cfg, params, _ = eagle.load(tmp_path / "d", target)
  drafter = eagle.Eagle(cfg, 3, 3, 8, sampled=False)
  kw = dict(max_new_tokens=24, max_len=48, eos_id=[5])
  out = generate(target.params, target.cfg, PROMPTS, drafter=drafter, drafter_params=params, **kw)
  assert out.tokens == _ar().tokens
  assert out.metrics["target_calls"] < _ar().metrics["target_calls"] * 2


V5_PROMPTS, V5_STOP = ([1, 2, 1, 2], [3], [0, 2, 2, 1, 3, 0]), (4,)


@dataclasses.dataclass(frozen=True)
class _D2tTwice(eagle.Eagle):
  """Broken: the drafted tokens go through d2t a second time (target id + d2t of its draft id)
  while their q stays where one mapping put it."""

  def _rerank(self, params, pool):
    draft = super()._rerank(params, pool)
    ids = params["vocab_ids"]
    d2t = ids - jnp.arange(ids.shape[0])
    draft_id = (
      jnp.zeros((self.cfg.target.vocab_size,), jnp.int32).at[ids].set(jnp.arange(ids.shape[0]))
    )
    return dataclasses.replace(draft, tokens=draft.tokens + d2t[draft_id[draft.tokens]])


@pytest.mark.slow
def test_an_imported_reduced_vocabulary_eagle3_samples_the_targets_distribution(tmp_path):
  """The multi-step exact-distribution check (five tokens, three ragged prompts in one batch,
  a stop id, T = 1 with top-p 0.8) passes for a speculators EAGLE-3 with a 3-token draft
  vocabulary and d2t, sampled candidates on a dynamic tree; it fails when d2t is applied twice."""
  target = _target(layers=3, vocab=5, seed=7)
  _eagle3_speculators(target, tmp_path / "d", [0, 1, 3], aux=[1, 2, 3], seed=5)
  cfg, params, _ = eagle.load(tmp_path / "d", target)
  assert params["vocab_ids"].tolist() == [0, 1, 3]
  kw = dict(prompts=V5_PROMPTS, num_new=5, rows=1500, calls=2, stop_ids=V5_STOP)
  knobs = dict(temperature=1.0, top_p=0.8)
  pair = (target.cfg, target.params)
  good = testing.exact_pvalues(pair, eagle.Eagle(cfg, 2, 2, 3, sampled=True), params, knobs, **kw)
  assert min(good) > P_PASS / len(good), good
  broken = _D2tTwice(cfg, 2, 2, 3, sampled=True)  # fails by far (p ~ 1e-100 at these counts)
  kw |= dict(rows=1000, calls=1)
  assert min(testing.exact_pvalues(pair, broken, params, knobs, **kw)) < P_FAIL


# --- bad inputs: one clear error each, before anything compiles -------------------------------


def _published(tmp_path, fmt="speculators"):
  """A published-layout drafter directory (specjax's own export: no torch needed)."""
  target = _target(layers=4)
  drafter, params = _trained(target, "eagle3", (0, 1, 3), REDUCED)
  interop.export(drafter.cfg, params, tmp_path / "d", fmt, "float32", "tiny-llama")
  return target, tmp_path / "d"


def _edit_tensors(directory, edit):
  path = directory / "model.safetensors"
  tensors = load_file(str(path))
  edit(tensors)
  save_file(tensors, str(path))


def _edit_config(directory, **changes):
  path = directory / "config.json"
  path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def _truncate(directory):
  path = directory / "model.safetensors"
  path.write_bytes(path.read_bytes()[:-100])


def _other_embedding(tensors):
  tensors["embed_tokens.weight"] = np.ones((64, F), np.float32)


BAD = {
  "a tensor missing": (
    lambda d: _edit_tensors(d, lambda t: t.pop("layers.0.mlp.up_proj.weight")),
    "missing layers.0.mlp.up_proj.weight.*This layout holds:\n  lm_head.weight \\[21, 32\\]",
  ),
  "a tensor misshapen": (
    lambda d: _edit_tensors(d, lambda t: t.update({"fc.weight": t["fc.weight"][:, :64]})),
    r"fc.weight is \[32, 64\], expected \[32, 96\]",
  ),
  "an unknown tensor": (
    lambda d: _edit_tensors(d, lambda t: t.update({"extra.weight": t["norm.weight"]})),
    r"unexpected extra.weight \[32\]",
  ),
  "a truncated file": (_truncate, "model.safetensors is damaged or truncated"),
  "a flag specjax does not compute": (
    lambda d: _edit_config(d, fc_norm=True), "fc_norm=True .an RMSNorm on each auxiliary"
  ),
  "speculators' norm_output": (
    lambda d: _edit_config(d, norm_output=True), "norm_output=True .the normed output fed back"
  ),
  "auxiliary layer 0 (the embeddings)": (
    lambda d: _edit_config(d, eagle_aux_hidden_state_layer_ids=[0, 1, 3]),
    "0, the embeddings, is not a layer's output",
  ),
  "a two-layer drafter": (
    lambda d: _edit_config(
      d, transformer_layer_config=json.loads((d / "config.json").read_text())[
        "transformer_layer_config"] | {"num_hidden_layers": 2}
    ),
    "num_hidden_layers=2: specjax's EAGLE drafter has one decoder layer",
  ),
  "d2t out of the target's vocabulary": (
    lambda d: _edit_tensors(d, lambda t: t.update({"d2t": t["d2t"] + 60})),
    "d2t maps the 21 draft ids to",
  ),
  "an embedding of another target": (
    lambda d: _edit_tensors(d, _other_embedding), "differs from the target's"
  ),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=BAD)
def test_a_bad_published_drafter_is_one_clear_error(tmp_path, case):
  target, directory = _published(tmp_path)
  damage, text = BAD[case]
  damage(directory)
  with pytest.raises(ValueError, match=text):
    eagle.load(directory, target)


def test_a_target_of_another_hidden_size_is_refused_from_the_headers(tmp_path):
  """Before any weight loads: the drafter's config against the target's config.json alone
  (``Eagle.check``, as ``build.check`` runs it), and again in ``load``."""
  _, directory = _published(tmp_path)
  wide = transformers.LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=64,
                                  num_hidden_layers=4, num_attention_heads=4)  # fmt: skip
  wide.save_pretrained(tmp_path / "wide")  # config.json only: no weights to load
  c = eagle.Eagle.config()
  c.path = str(directory)
  config = types.SimpleNamespace(
    target=source.config(source="safetensors", path=str(tmp_path / "wide"))
  )
  with pytest.raises(ValueError, match="hidden size 32 .drafter 32.*hidden size 48"):
    eagle.Eagle.check(c, config)
  c.format = "eagle"
  with pytest.raises(ValueError, match="format='eagle', but .* holds a 'speculators' drafter"):
    eagle.Eagle.check(c, config)


def test_a_published_drafter_named_by_format_and_its_torch_pickle(tmp_path):
  """``format`` names the layout (``auto`` detects it); a SafeAILab drafter saved with
  torch.save reads through specjax.models.torch_files, or is one clear error without it."""
  target, directory = _published(tmp_path, "eagle3")
  cfg, _, meta = eagle.load(directory, target, "eagle3")
  assert meta["layout"] == interop.NAMES["eagle3"]
  tensors = load_file(str(directory / "model.safetensors"))
  torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, directory / "pytorch_model.bin")
  (directory / "model.safetensors").unlink()
  try:
    from specjax.models import torch_files  # noqa: F401
  except ImportError:
    with pytest.raises(ValueError, match="pytorch_model.bin is a torch pickle"):
      eagle.load(directory, target)
    return
  cfg2, params, _ = eagle.load(directory, target)
  assert cfg2 == cfg and np.array_equal(params["fuse"], tensors["fc.weight"])
