"""Loads Llama/Qwen/Mistral checkpoints (GGUF files, HF safetensors directories) as llama.py params.

    cfg, params = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    cfg, params = load_safetensors("path/to/hf_checkpoint_dir")

Both return the params of ``specjax.models.llama`` (fp32, matrices ``[out, in]`` as both formats
store them), named by ``llama.SCHEMA``'s GGUF and HF columns. Every hyper-parameter comes from
the file's own metadata; nothing is typed by hand.
"""

import collections
import functools
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding

from specjax import parallel
from specjax.models import llama, rope, schema, torch_files
from specjax.models.config import ModelConfig
from specjax.typing import Params

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2")

# ----------------------------------------------------------------------------------------------
# GGUF


@functools.cache
def _reader_class():
  import gguf

  class _FastReader(gguf.GGUFReader):
    """GGUFReader that parses metadata from a plain ndarray view of its memmap.

    Slicing an ``np.memmap`` runs ``memmap.__array_finalize__`` on every one of the ~10^6 small
    views the reader makes for the vocab and merges; a plain view of the same buffer is about 3x
    faster to parse (SmolLM2 4.3 s -> 1.7 s) and still reads lazily from the mapped file.
    """

    def _get(self, offset, dtype, count=1, override_order=None):
      if type(self.data) is np.memmap:
        self.data = self.data.view(np.ndarray)
      return super()._get(offset, dtype, count, override_order)

  return _FastReader


def open_gguf(path):
  """Opens and validates a GGUF file; a corrupt or truncated file raises ``ValueError``.

  The reader is shared by ``load_gguf`` and ``Tokenizer.from_gguf`` so the metadata (vocab,
  merges) is parsed once. The last few files opened keep their reader (a reader only reads):
  a run checks its config, then loads the same file, and parses it once (SmolLM2 ~2 s, Qwen's
  151,936 tokens ~6 s here). A file changed since (size or modification time) is read anew.
  """
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"GGUF file not found: {path}")
  stat = path.stat()
  reader_class = _reader_class()
  key = (reader_class, os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
  if key in _OPEN:
    _OPEN.move_to_end(key)  # the most recently used last
  else:
    _OPEN[key] = _open_checked(reader_class, path, stat.st_size)
  while len(_OPEN) > _KEEP_OPEN:
    _OPEN.popitem(last=False)
  return _OPEN[key]


_KEEP_OPEN = 2  # readers of the files last opened (a target and its draft)
_OPEN: collections.OrderedDict = collections.OrderedDict()


def _open_checked(reader_class, path, size):
  try:
    reader = reader_class(path)
  except Exception as e:  # The reader fails with bare numpy/struct errors on garbage.
    raise ValueError(
      f"{path} is not a readable GGUF file ({size} bytes; truncated or corrupt?): "
      f"{type(e).__name__}: {e}"
    ) from e
  _check_tensor_extents(reader, path, size)
  return reader


def _check_tensor_extents(reader, path, size):
  # A file cut inside the tensor data still parses: numpy silently returns short slices of the
  # memmap, which would only fail later as a baffling reshape error.
  for t in reader.tensors:
    end = int(t.data_offset) + int(t.n_bytes)
    if end > size or t.data.nbytes != int(t.n_bytes):
      raise ValueError(
        f"{path} is truncated or corrupt: tensor {t.name!r} needs bytes up to {end}, but the "
        f"file has {size} bytes."
      )


def as_gguf_reader(path_or_reader):
  """An ``open_gguf`` reader; one passed in is returned as is."""
  import gguf

  if isinstance(path_or_reader, gguf.GGUFReader):
    return path_or_reader
  return open_gguf(path_or_reader)


def gguf_field(reader, key, default=None):
  """The value of metadata ``key`` (str, number, bool or list), or ``default`` when absent."""
  field = reader.get_field(key)
  if field is None:
    return default
  return field.contents()


def _require(reader, key):
  value = gguf_field(reader, key)
  if value is None:
    raise ValueError(f"GGUF metadata lacks required key {key!r}.")
  return value


def gguf_config(reader) -> ModelConfig:
  """ModelConfig from the GGUF metadata and tensor inventory."""
  arch = gguf_field(reader, "general.architecture")
  if arch not in SUPPORTED_GGUF_ARCHS:
    raise ValueError(
      f"Unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_GGUF_ARCHS)}."
    )
  names = {t.name for t in reader.tensors}
  heads = int(_require(reader, f"{arch}.attention.head_count"))
  dim = int(_require(reader, f"{arch}.embedding_length"))
  head_dim = int(gguf_field(reader, f"{arch}.attention.key_length", dim // heads))
  rope_dims = gguf_field(reader, f"{arch}.rope.dimension_count", head_dim)
  if int(rope_dims) != head_dim:
    raise ValueError(f"Partial rotary embedding ({rope_dims} of {head_dim} dims) is unsupported.")
  scaling = gguf_field(reader, f"{arch}.rope.scaling.type", "none")
  if scaling not in ("none", None) or "rope_freqs.weight" in names:
    raise ValueError(f"RoPE scaling ({scaling!r}) is unsupported by specjax.models.llama.")
  embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
  if embed is None:
    raise ValueError("GGUF file lacks tensor 'token_embd.weight'.")
  return ModelConfig(
    # The embedding's row count is the truth; the vocab_size key is optional in GGUF.
    vocab_size=int(embed.shape[1]),
    dim=dim,
    num_layers=int(_require(reader, f"{arch}.block_count")),
    num_heads=heads,
    num_kv_heads=int(gguf_field(reader, f"{arch}.attention.head_count_kv", heads)),
    ffn_dim=int(_require(reader, f"{arch}.feed_forward_length")),
    head_dim=head_dim,
    rope_theta=float(gguf_field(reader, f"{arch}.rope.freq_base", 10_000.0)),
    norm_eps=float(_require(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
    tie_embeddings="output.weight" not in names,
    qkv_bias="blk.0.attn_q.bias" in names,
    name=str(gguf_field(reader, "general.name", arch)),
  )


def _unpermute_rows(w_OxI, n_heads):
  """Undoes llama.cpp's q/k row permutation: interleaved rope pairs -> half-split halves.

  llama.cpp's converter reorders each head's rows from [x0..x_{h/2-1}, y0..y_{h/2-1}] (HF's
  rotate_half layout, which llama.py uses) to [x0, y0, x1, y1, ...] (GPT-J style pairs). Works for
  a weight [out, in] and a bias [out] alike.
  """
  out = w_OxI.shape[0]
  rest = w_OxI.shape[1:]
  return w_OxI.reshape(n_heads, out // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w_OxI.shape)


def _dequantize(tensor):
  import gguf

  w = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  # Numpy shape is GGUF's ne reversed, i.e. [out, in] for a matrix; 1-D tensors come back 1-D.
  return np.asarray(w, dtype=np.float32).reshape([int(n) for n in reversed(tensor.shape)])


def load_gguf(path_or_reader) -> tuple[ModelConfig, Params]:
  """(ModelConfig, params) from a GGUF file (or an ``open_gguf`` reader); weights in fp32."""
  reader = as_gguf_reader(path_or_reader)
  cfg = gguf_config(reader)
  arch = gguf_field(reader, "general.architecture")
  tensors = {t.name: t for t in reader.tensors}

  def load(name, path):
    t = tensors.pop(name, None)
    if t is None:
      raise ValueError(f"GGUF file lacks tensor {name!r} required by a {arch} model.")
    w = _dequantize(t)
    # Only the llama converter permutes q/k rows; qwen2 files keep HF's row order.
    if arch == "llama" and path[-1] in ("wq", "bq"):
      w = _unpermute_rows(w, cfg.num_heads)
    elif arch == "llama" and path[-1] in ("wk", "bk"):
      w = _unpermute_rows(w, cfg.num_kv_heads)
    # Moving each weight to jax as soon as it is read keeps peak host memory near one copy.
    return _to_device(w)

  names = schema.checkpoint_names(llama.SCHEMA, cfg, cfg.num_layers, "gguf")
  params = schema.assemble({path: load(n, path) for n, path in names.items()}, cfg.num_layers)
  if tensors:
    raise ValueError(f"GGUF file has tensors a {arch} model does not use: {sorted(tensors)[:8]}")
  llama.check_params(cfg, params)
  return cfg, params


# ----------------------------------------------------------------------------------------------
# HF safetensors


# What each supported architecture adds to the Llama block; everything else is refused.
_HF_FAMILIES = {
  "LlamaForCausalLM": "Llama 1-3.x, SmolLM, DeepSeek-R1-Distill-Llama",
  "Qwen2ForCausalLM": "Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen",
  "Qwen3ForCausalLM": "Qwen3 dense",
  "MistralForCausalLM": "Mistral 7B",
}
SUPPORTED_HF_ARCHS = tuple(_HF_FAMILIES)
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}  # fmt: skip
# Config keys that mean a block specjax does not have, whatever the architecture says.
_REFUSED_KEYS = {
  "num_local_experts": "mixture of experts",
  "num_experts": "mixture of experts",
  "n_routed_experts": "mixture of experts",
  "kv_lora_rank": "multi-head latent attention (MLA)",
  "q_lora_rank": "multi-head latent attention (MLA)",
}


def supported_architectures() -> str:
  return ", ".join(f"{a} ({what})" for a, what in _HF_FAMILIES.items())


def _hf_architecture(config) -> str:
  archs = config.get("architectures") or [_MODEL_TYPES.get(config.get("model_type"), "?")]
  arch = archs[0]
  if arch not in _HF_FAMILIES:
    why = ""
    if "Gemma" in arch:
      why = " (Gemma's norms, embedding scale and activations differ from the Llama block)"
    elif "Moe" in arch or "Mixtral" in arch:
      why = " (mixture of experts)"
    elif "Deepseek" in arch:
      why = " (multi-head latent attention and mixture of experts)"
    raise ValueError(
      f"HF architecture {arch!r} is unsupported{why}; supported: {supported_architectures()}."
    )
  for key, what in _REFUSED_KEYS.items():
    if config.get(key):
      raise ValueError(
        f"config key {key}={config[key]!r} means {what}, which specjax does not implement; "
        f"supported: {supported_architectures()}."
      )
  act = config.get("hidden_act", "silu")
  if act not in ("silu", "swish"):
    raise ValueError(
      f"config key hidden_act={act!r} is unsupported: specjax's MLP is SwiGLU (silu)."
    )
  return arch


def _sliding_window(config, arch: str) -> int:
  """Mistral's window (0 for none); a sliding window anywhere else is refused."""
  layer_types = set(config.get("layer_types") or ())
  if arch == "MistralForCausalLM":
    return int(config.get("sliding_window") or 0)
  if config.get("use_sliding_window") or layer_types - {"full_attention"}:
    raise ValueError(
      f"{arch} with use_sliding_window / layer_types {sorted(layer_types)} mixes sliding-window "
      "layers, which specjax does not implement; use a config with full attention in every layer."
    )
  return 0


def _hf_config(config) -> ModelConfig:
  arch = _hf_architecture(config)
  heads = config["num_attention_heads"]
  head_dim = config.get("head_dim") or (
    128 if arch == "Qwen3ForCausalLM" else config["hidden_size"] // heads
  )
  inv_freq, attention_factor = rope.from_hf(config, head_dim)
  llama_like = arch in ("LlamaForCausalLM", "Qwen3ForCausalLM")  # attention_bias: q, k, v and o
  if config.get("mlp_bias") and arch != "LlamaForCausalLM":
    raise ValueError(f"config key mlp_bias=True is a Llama option; {arch} has no MLP biases.")
  window = _sliding_window(config, arch)
  cfg = ModelConfig(
    vocab_size=config["vocab_size"],
    dim=config["hidden_size"],
    num_layers=config["num_hidden_layers"],
    num_heads=heads,
    num_kv_heads=config.get("num_key_value_heads") or heads,
    ffn_dim=config["intermediate_size"],
    head_dim=head_dim,
    rope_theta=float(rope.parameters(config)["rope_theta"]),
    norm_eps=float(config["rms_norm_eps"]),
    # HF's default for every supported family is untied.
    tie_embeddings=bool(config.get("tie_word_embeddings", False)),
    qkv_bias=arch == "Qwen2ForCausalLM" or (llama_like and bool(config.get("attention_bias"))),
    out_bias=llama_like and bool(config.get("attention_bias")),
    mlp_bias=bool(config.get("mlp_bias")),
    qk_norm=arch == "Qwen3ForCausalLM",
    rope_inv_freq=inv_freq,
    rope_attention_factor=attention_factor,
    rope_scaling=rope.scaling(config),
    sliding_window=window,
    name=config.get("_name_or_path") or arch,
  )
  return cfg


def _tensor_files(directory: Path) -> dict[str, Path]:
  """Each tensor's file: from the sharded checkpoint's index, else from every file's header."""
  index = directory / "model.safetensors.index.json"
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise ValueError(
        f"{index} is not a safetensors index ({e}): re-export the checkpoint."
      ) from None
    return {name: directory / f for name, f in weight_map.items()}
  files = sorted(directory.glob("*.safetensors"))
  if not files:
    raise FileNotFoundError(f"No *.safetensors files in {directory}.")
  out = {}
  for f in files:
    out |= dict.fromkeys(torch_files.safetensors_layout(f)[0], f)
  return out


def _stream_safetensors(files: dict[str, Path], names, dtype, put=None) -> dict:
  """``{name: array}`` of ``names``, read file by file, tensor by tensor, each cast to
  ``dtype`` on its way to the device (``put(name, array)``, default ``jax.device_put``): host
  memory holds one tensor besides the result, never a whole shard (plain reads, not a memory
  map whose pages would stay resident; ``tests/test_families.py`` measures it on a sharded
  checkpoint)."""
  put = put or (lambda name, w: jax.device_put(w))
  by_file: dict[Path, list[str]] = {}
  for name in names:
    by_file.setdefault(files[name], []).append(name)
  out = {}
  for path, wanted in by_file.items():
    infos, spans, start = torch_files.safetensors_layout(path)
    with open(path, "rb") as f:
      for name in wanted:
        if name not in infos:
          raise ValueError(f"{path} lacks tensor {name!r}, which its index places there.")
        w = torch_files.read_safetensor(f, start, spans[name], infos[name])
        out[name] = put(name, w.astype(dtype, copy=False))
        del w
  return out


def safetensors_config(directory) -> ModelConfig:
  """The ModelConfig of an HF checkpoint directory, from its config.json alone."""
  directory = Path(directory)
  config_path = directory / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(f"No config.json in {directory}.")
  try:
    return _hf_config(json.loads(config_path.read_text()))
  except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
    what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
    raise ValueError(
      f"{config_path} is not a valid HF config ({what}): re-export the checkpoint."
    ) from None


def check_safetensors(directory) -> tuple[ModelConfig, dict[str, Path], dict[str, tuple]]:
  """``(cfg, {tensor: file}, {tensor: params path})`` of an HF checkpoint directory, from its
  config.json and its files' headers alone: every tensor the config needs is there, none is
  left over, and each has the shape the config implies. Nothing is read but headers."""
  directory = Path(directory)
  cfg = safetensors_config(directory)
  files = _tensor_files(directory)
  names = schema.checkpoint_names(llama.SCHEMA, cfg, cfg.num_layers, "hf")
  missing = sorted(n for n in names if n not in files)
  if missing:
    raise ValueError(
      f"Checkpoint in {directory} lacks tensor {missing[0]!r} ({len(missing)} missing)."
    )
  unused = {n for n in files if n not in names and not n.endswith("rotary_emb.inv_freq")}
  if cfg.tie_embeddings:
    unused.discard("lm_head.weight")  # Some tied checkpoints still write a copy.
  if unused:
    raise ValueError(f"Checkpoint has tensors specjax does not use: {sorted(unused)[:8]}")
  _check_tensor_shapes(directory, cfg, files, names)
  return cfg, files, names


def load_safetensors(directory, dtype=jnp.float32, mesh=None) -> tuple[ModelConfig, Params]:
  """(ModelConfig, params) from an HF checkpoint directory (config.json + *.safetensors, one
  file or shards with their index), every weight as ``dtype`` (float32 or bfloat16).

  With a ``mesh``, each tensor goes from the file straight to its placement (``llama.RULES``,
  as ``placement.place`` would put it): no device holds a whole weight that is split, and
  placing the result again moves nothing. Each process fills only its own devices."""
  directory = Path(directory)
  cfg, files, names = check_safetensors(directory)
  put = None
  if mesh is not None:
    paths = {name: "/".join(map(str, path)) for name, path in names.items()}

    def put(name, w):
      spec = parallel.spec_for(paths[name], w.shape, llama.RULES, mesh)
      return parallel.put_global(w, NamedSharding(mesh, spec))

  tensors = _stream_safetensors(files, names, dtype, put)
  params = schema.assemble({path: tensors.pop(n) for n, path in names.items()}, cfg.num_layers)
  llama.check_params(cfg, params)
  if cfg.sliding_window:
    logging.info(
      "%s: sliding window of %d tokens; attention is plain causal, exact while max_len <= %d "
      "(longer is refused).",
      cfg.name,
      cfg.sliding_window,
      cfg.sliding_window,
    )
  return cfg, params


def _check_tensor_shapes(directory: Path, cfg: ModelConfig, files: dict, names: dict) -> None:
  """Every tensor's shape in its file's header against what config.json implies, before any
  tensor is read: a mismatch names the file, the tensor and both shapes."""
  want = {path: p.shape(cfg) for path, p in schema.entries(llama.SCHEMA, cfg, cfg.num_layers)}
  headers = {}
  for name, path in names.items():
    f = files[name]
    if f not in headers:
      headers[f] = torch_files.safetensors_layout(f)[0]
    info = headers[f].get(name)
    if info is not None and tuple(info.shape) != tuple(want[path]):
      raise ValueError(
        f"{f}: tensor {name!r} is {list(info.shape)}, but {directory / 'config.json'} implies "
        f"{list(want[path])} (vocab_size {cfg.vocab_size}, hidden_size {cfg.dim}, "
        f"intermediate_size {cfg.ffn_dim}, {cfg.num_heads} heads of {cfg.head_dim}, "
        f"{cfg.num_kv_heads} kv heads): the config and the weights are of different models."
      )


# ----------------------------------------------------------------------------------------------
# Shared


def _to_device(w):
  """An fp32 jax array (``jax.device_put``: ~2x faster than ``jnp.asarray`` on CPU)."""
  return jax.device_put(np.asarray(w, dtype=np.float32))
