"""Model families from HF directories: Llama 3.x, Qwen3, Mistral, DeepSeek-R1 distills, refusals.

Each family is a tiny random model built with transformers' own config class and saved with
``save_pretrained`` (safetensors). specjax must give transformers' fp32 logits at every position,
transformers' greedy tokens (``generate``), and the same tokens with prompt lookup; leaving out
the family's feature (scaled RoPE, biases, q/k norms) must break the logits parity.
"""

import dataclasses
import importlib.util
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import generate
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import checkpoint, export, llama, rope, tiny

pytestmark = pytest.mark.skipif(
  not (importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")),
  reason="torch/transformers absent: pip install torch==2.13.0 transformers accelerate",
)

_VOCAB = 256
_BASE = dict(
  vocab_size=_VOCAB,
  hidden_size=64,
  intermediate_size=128,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  rms_norm_eps=1e-6,
  max_position_embeddings=256,
  bos_token_id=None,
  eos_token_id=None,
  pad_token_id=None,
)
# Scaling that really moves the frequencies: the original context (32) is below the tested one.
_LLAMA3 = {
  "rope_type": "llama3",
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 32,
}
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}

# family -> (transformers config class, its kwargs, the config fields whose loss must show)
FAMILIES = {
  "llama3_bias": (
    "LlamaConfig",
    dict(rope_scaling=_LLAMA3, attention_bias=True, mlp_bias=True, head_dim=32),
    dict(rope_inv_freq=(), out_bias=False, mlp_bias=False),
  ),
  "llama_linear_tied": (
    "LlamaConfig",
    dict(rope_scaling={"rope_type": "linear", "factor": 4.0}, tie_word_embeddings=True),
    dict(rope_inv_freq=()),
  ),
  "qwen3_yarn": (
    "Qwen3Config",
    dict(head_dim=32, tie_word_embeddings=True, rope_scaling=_YARN),
    dict(qk_norm=False, rope_inv_freq=(), rope_attention_factor=1.0),
  ),
  "mistral": ("MistralConfig", dict(sliding_window=96, head_dim=16), {}),
  # DeepSeek-R1-Distill-Llama-8B is a Llama 3.1 config: llama3 RoPE, theta 5e5, untied.
  "r1_distill_llama": (
    "LlamaConfig",
    dict(rope_scaling=_LLAMA3, rope_theta=500_000.0),
    dict(rope_inv_freq=()),
  ),
  # DeepSeek-R1-Distill-Qwen is a Qwen2 config with sliding_window set but use_sliding_window off.
  "r1_distill_qwen": (
    "Qwen2Config",
    dict(sliding_window=4096, use_sliding_window=False, max_window_layers=2),
    dict(qkv_bias=False),
  ),
}
_PROMPTS = [[7, 8, 9, 10, 11, 7, 8, 9, 200, 13, 14, 15, 7, 8, 9, 10], [40, 41, 42, 40, 41, 42, 43]]
_NEW = 64  # greedy tokens compared with transformers' generate
_MAX_LEN = 96  # within Mistral's window of 96


def _randomize(model, seed):
  """Non-trivial weights: random norms and biases too, so a mis-mapped tensor shows."""
  import torch

  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.15 * noise)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
  """``load(name)``: (transformers model, specjax cfg, params, ablations, directory) of one
  family, built, saved with ``save_pretrained`` and loaded once per module."""
  import transformers

  loaded = {}

  def load(name):
    if name not in loaded:
      config_cls, kw, ablations = FAMILIES[name]
      config = getattr(transformers, config_cls)(**(_BASE | kw))
      hf = transformers.AutoModelForCausalLM.from_config(config)
      _randomize(hf, seed=len(name))
      hf.eval()
      path = tmp_path_factory.mktemp(name)
      hf.save_pretrained(path)
      loaded[name] = (hf, *checkpoint.load_safetensors(path), ablations, path)
    return loaded[name]

  return load


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_match_hf_at_every_position(families, name):
  import torch

  hf, cfg, params, ablations, _ = families(name)
  ids = np.random.default_rng(0).integers(0, _VOCAB, size=(2, 48))
  with torch.no_grad():
    ref = hf(torch.tensor(ids)).logits.numpy()
  got, _ = llama.logits_of(params, cfg, jnp.asarray(ids))
  np.testing.assert_allclose(np.asarray(got), ref, atol=1e-4, rtol=0)
  assert np.abs(ref).max() > 1.0  # The comparison is not between two near-zero tensors.
  # Teeth: each of the family's features, left out, moves the logits far past the tolerance.
  for field, value in ablations.items():
    broken, _ = llama.logits_of(params, dataclasses.replace(cfg, **{field: value}), ids)
    assert np.abs(np.asarray(broken) - ref).max() > 1e-2, f"{name}: {field} makes no difference"


# One family per distinct block (the two left out differ from these only in RoPE and head tying,
# which the logits test covers): each compiles two decode loops, ~5 s each here.
@pytest.mark.parametrize("name", ["llama3_bias", "qwen3_yarn", "mistral", "r1_distill_qwen"])
def test_speculative_decoding_equals_hf_greedy(families, name):
  """Speculative decoding with prompt lookup and with a draft model (the family's own first
  layer) gives transformers' greedy ``generate`` tokens, 64 of them: the target's
  autoregressive output, through specjax's cache, loop and verification."""
  import torch

  hf, cfg, params, _, _ = families(name)
  want = []
  for prompt in _PROMPTS:
    with torch.no_grad():
      out = hf.generate(
        torch.tensor([prompt]), max_new_tokens=_NEW, min_new_tokens=_NEW, do_sample=False
      )
    want.append(out[0, len(prompt) :].tolist())
  dcfg, dparams = tiny.truncated(cfg, params, 1)
  for drafter, drafter_params in ((PromptLookup(4), None), (DraftModel(dcfg, 3), dparams)):
    spec = generate(
      params, cfg, _PROMPTS, drafter=drafter, drafter_params=drafter_params,
      max_new_tokens=_NEW, max_len=_MAX_LEN,
    )  # fmt: skip
    assert spec.tokens == want, f"{name}: {drafter.name} differs from transformers' greedy"
    assert sum(spec.metrics["accept_hist"][1:]) > 0  # drafts were accepted, not only corrections


@pytest.mark.parametrize("name", list(FAMILIES))
def test_export_round_trip(families, name, tmp_path):
  """A draft of the family's shape exports as the same architecture and loads back unchanged."""
  _, cfg, params, _, _ = families(name)
  export.save_model(tmp_path / "draft", cfg, params)
  got_cfg, got = checkpoint.load_safetensors(tmp_path / "draft")
  assert dataclasses.replace(got_cfg, name=cfg.name) == cfg
  for want, have in zip(jax.tree.leaves(params), jax.tree.leaves(got), strict=True):
    np.testing.assert_array_equal(np.asarray(have), np.asarray(want))


def test_mistral_window(families, caplog):
  """Within the window: plain causal attention, said at load; beyond it: one clear error."""
  _, cfg, params, _, path = families("mistral")
  with caplog.at_level(logging.INFO):
    assert checkpoint.load_safetensors(path)[0].sliding_window == 96
  said = [r.getMessage() for r in caplog.records if "sliding window" in r.getMessage()]
  assert len(said) == 1 and "plain causal" in said[0], caplog.text
  with pytest.raises(ValueError, match=r"max_len=97 .*sliding window of 96"):
    generate(params, cfg, _PROMPTS, max_new_tokens=4, max_len=97)


def _write_config(tmp_path, config):
  (tmp_path / "config.json").write_text(json.dumps(config))
  return tmp_path


def _llama_json(**changes):
  from transformers import LlamaConfig

  return LlamaConfig(**_BASE).to_dict() | changes


@pytest.mark.parametrize(
  "changes,message",
  [
    ({"architectures": ["Gemma3ForCausalLM"]}, r"'Gemma3ForCausalLM'.*supported: LlamaForCausalLM"),
    ({"architectures": ["MixtralForCausalLM"]}, r"'MixtralForCausalLM' .*mixture of experts"),
    ({"architectures": ["DeepseekV3ForCausalLM"]}, r"DeepseekV3ForCausalLM.*latent attention"),
    ({"architectures": ["NoSuchForCausalLM"]}, r"NoSuchForCausalLM.*Qwen2ForCausalLM"),
    ({"num_local_experts": 8}, r"num_local_experts=8 .*mixture of experts"),
    ({"kv_lora_rank": 16}, r"kv_lora_rank.*MLA"),
    (
      {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
      r"rope_parameters.rope_type='dynamic' .*supported: default, linear, llama3, yarn",
    ),
    (
      {"rope_parameters": None, "rope_scaling": {"type": "longrope", "factor": 2.0}},
      r"rope_scaling.rope_type='longrope' .*supported: default, linear, llama3, yarn",
    ),
    ({"partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5"),
    ({"hidden_act": "gelu_pytorch_tanh"}, r"hidden_act='gelu_pytorch_tanh'"),
  ],
)
def test_unsupported_is_one_error_before_loading(tmp_path, changes, message):
  """The directory holds config.json only: the error comes from the config, before any weight."""
  directory = _write_config(tmp_path, _llama_json(**changes))
  with pytest.raises(ValueError, match=message):
    checkpoint.load_safetensors(directory)


def test_qwen_sliding_layers_refused(tmp_path):
  from transformers import Qwen3Config

  config = Qwen3Config(**_BASE, use_sliding_window=True, sliding_window=16).to_dict()
  with pytest.raises(ValueError, match="sliding-window"):
    checkpoint.load_safetensors(_write_config(tmp_path, config))


def test_rope_frequencies_are_transformers(tmp_path):
  """The inverse frequencies themselves, for every supported type, at a real head size."""
  import transformers
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

  for scaling in (
    _LLAMA3 | {"original_max_position_embeddings": 8192, "factor": 32.0},
    {"rope_type": "linear", "factor": 4.0},
    _YARN | {"original_max_position_embeddings": 4096, "beta_fast": 16},
    _YARN | {"original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5},
  ):
    config = transformers.LlamaConfig(
      **(_BASE | {"max_position_embeddings": 131072}),
      head_dim=128,
      rope_theta=500_000.0,
      rope_scaling=dict(scaling),
    )
    ref, ref_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, None)
    got, factor = rope.from_hf(config.to_dict(), 128)
    np.testing.assert_allclose(np.asarray(got), ref.numpy(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(ref_factor)


def test_eagle_layer_of_a_biased_target_widens():
  """An EAGLE layer copies the target's block (here Llama biases and Qwen3 q/k norms); widening
  its MLP widens the gate and up biases with the weights."""
  from specjax.drafters import eagle
  from specjax.drafters.eagle import model as eagle_model
  from specjax.models import tiny

  cfg = tiny.tiny_config(vocab_size=16, dim=16, mlp_bias=True, out_bias=True, qkv_bias=True)
  cfg = dataclasses.replace(cfg, qk_norm=True)
  narrow = eagle.EagleConfig(cfg)
  wide = dataclasses.replace(narrow, ffn_dim=3 * cfg.ffn_dim)
  # Shapes only (traced, not run): the test costs no compile.
  trained = lambda: {"layer": eagle_model._fresh_layer(narrow, jax.random.key(0))}  # noqa: E731
  layer = jax.eval_shape(lambda: eagle.widen(trained(), wide, jax.random.key(1))["layer"])
  top = {"embed": jnp.zeros((1, 16)), "final_norm": jnp.ones(16), "lm_head": jnp.zeros((1, 16))}
  llama.check_params(dataclasses.replace(wide.layer, vocab_size=1), top | {"layers": (layer,)})
  assert layer["b_gate"].shape == layer["b_up"].shape == (3 * cfg.ffn_dim,)


def test_window_is_checked_before_the_weights_load(families):
  """``build.check_request`` reads the window from config.json: a too-long max_len is refused
  before a 7B model's weights would be read."""
  from configs import tiny as tiny_configs
  from specjax import build
  from specjax.models import source

  *_, path = families("mistral")
  c = tiny_configs.get_config()
  c.target = source.config(source="safetensors", path=str(path))
  c.max_len = 97
  with pytest.raises(ValueError, match=r"max_len=97 .*sliding window of 96.*config.max_len"):
    build.check_request(c)


def test_bfloat16_checkpoint_loads_as_transformers_reads_it(families, tmp_path):
  """An HF directory saved in bfloat16 (how Llama 3.x, Qwen3 and Mistral are published) loads,
  as float32 equal to transformers' float32 upcast of the same weights and as bfloat16 equal
  to the file's bits."""
  import torch

  hf, cfg, _, _, _ = families("llama3_bias")
  hf.to(torch.bfloat16).save_pretrained(tmp_path)
  hf.to(torch.float32)  # the fixture's model, as the other tests read it
  ref = {n: p.detach().to(torch.bfloat16).float().numpy() for n, p in hf.named_parameters()}
  _, as_f32 = checkpoint.load_safetensors(tmp_path)
  _, as_bf16 = checkpoint.load_safetensors(tmp_path, jnp.bfloat16)
  q = ref["model.layers.1.self_attn.q_proj.weight"]
  np.testing.assert_array_equal(np.asarray(as_f32["layers"][1]["wq"]), q)
  assert as_bf16["layers"][1]["wq"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(as_bf16["layers"][1]["wq"], np.float32), q)
  np.testing.assert_array_equal(np.asarray(as_f32["lm_head"]), ref["lm_head.weight"])


_MEASURE = """
import resource, sys
import jax, jax.numpy as jnp
from specjax.models import checkpoint
jnp.zeros(1).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg, params = checkpoint.load_safetensors(sys.argv[1])
jax.block_until_ready(params)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024)
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sharded_checkpoint_streams_shard_by_shard(tmp_path):
  """A checkpoint in 8 shards (about 140 MB of float32) with its index loads, and the load's
  peak host memory grows by at most 1.3 x the largest shard plus the result: tensors are read
  one by one, never the whole checkpoint at once (which would add all 140 MB)."""
  import subprocess
  import sys

  from safetensors.numpy import save_file

  from specjax.models import tiny

  cfg, params = tiny.random_model(seed=0, vocab_size=4096, dim=512, num_layers=8, ffn_dim=2048)
  export.save_model(tmp_path / "one", cfg, params)
  tensors = dict(export.hf_tensors(cfg, params))
  del params
  names, shards, index = sorted(tensors), 8, {}
  path = tmp_path / "sharded"
  path.mkdir()
  (path / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
  for k in range(shards):
    part = {n: tensors[n] for n in names[k::shards]}
    file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
    save_file(part, str(path / file))
    index |= dict.fromkeys(part, file)
  (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
  result = sum(t.nbytes for t in tensors.values())
  largest = max(f.stat().st_size for f in path.glob("*.safetensors"))
  assert largest < result / 3  # the bound below is far from "the whole checkpoint"
  out = subprocess.run(
    [sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, check=True
  )
  grew = int(out.stdout.split()[-1])
  assert grew <= 1.3 * largest + result, (grew, largest, result)
  # The same weights as the one-file checkpoint (the index maps every tensor to its shard).
  _, one = checkpoint.load_safetensors(tmp_path / "one")
  _, sharded = checkpoint.load_safetensors(path)
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(sharded), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _damaged_directory(tmp_path, case):
  from specjax.models import registry

  cfg, params = tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=2)
  d = tmp_path / "hf"
  export.save_model(d, cfg, params)
  if case == "no config.json":
    (d / "config.json").unlink()
  elif case == "no weights":
    for f in d.glob("*.safetensors"):
      f.unlink()
  elif case == "tokenizer.json not JSON":
    (d / "tokenizer.json").write_text("not json")
  elif case in ("vocab_size disagrees with the weights", "rope_scaling not an object"):
    config = json.loads((d / "config.json").read_text())
    if case.startswith("vocab"):
      config["vocab_size"] = 100
    else:
      config["rope_scaling"] = "yes please"
    (d / "config.json").write_text(json.dumps(config))
  elif case == "a file, not a directory":
    return "safetensors", d / "config.json"
  elif case == "a directory for source=gguf":
    return "gguf", d
  elif case == "a GGUF file for source=safetensors":
    return "safetensors", registry.resolve("smollm2-135m-instruct")
  elif case == "not a GGUF file":
    return "gguf", d / "config.json"
  return "safetensors", d


_DAMAGED = {
  "no config.json": "has no config.json",
  "no weights": r"has no \*.safetensors weights",
  "tokenizer.json not JSON": "tokenizer.json is not valid JSON",
  "vocab_size disagrees with the weights": r"model.safetensors: tensor 'model.embed_tokens.weight' "
  r"is \[64, 32\], but .*config.json implies \[100, 32\] \(vocab_size 100",
  "rope_scaling not an object": r"config.json's rope_scaling='yes please' is not an object",
  "a file, not a directory": "is a file; source=safetensors reads an HF directory",
  "a directory for source=gguf": "is a directory; source=gguf reads one .gguf file",
  "a GGUF file for source=safetensors": "set config.target.source=gguf for a GGUF file",
  "not a GGUF file": r"is not a GGUF file \(it starts with b'{",
}


@pytest.mark.parametrize("case", list(_DAMAGED))
def test_a_damaged_hf_directory_is_one_error_naming_the_field(tmp_path, case):
  """What an HF directory or GGUF path lacks is one ValueError naming config.target.path,
  from the checks that run before anything loads (each ended in a traceback before)."""
  from specjax.models import registry, source

  if case == "a GGUF file for source=safetensors" and not registry.installed(
    "smollm2-135m-instruct"
  ):
    pytest.skip("the SmolLM2 wheel is not installed (scripts/install_models.sh smollm2)")
  kind, path = _damaged_directory(tmp_path, case)
  with pytest.raises(ValueError, match=r"config\.target\.path=.*" + _DAMAGED[case]):
    source.check(source.config(source=kind, path=str(path)), "target")


def test_text_prompts_without_a_tokenizer_are_one_error(tmp_path):
  """An HF directory without tokenizer.json (or a random target) takes token-id prompts; text
  ones are refused by build.check naming the path, not read as characters."""
  from configs import demo
  from specjax import build
  from specjax.models import source

  cfg, params = tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=2)
  export.save_model(tmp_path / "hf", cfg, params)
  c = demo.base()
  c.target = source.config(source="safetensors", path=str(tmp_path / "hf"))
  with pytest.raises(ValueError, match=r"has no tokenizer.json, so prompts are token-id lists"):
    build.check(c)
  c.prompts = ((1, 2, 3),)
  build.check(c)
