"""Reading published EAGLE directories: the layout detected from its files and config.json, the
plan (the EagleConfig and every expected tensor, checked before any weight loads), the load.
The layouts and conventions: the package docstring (``formats/__init__.py``)."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters import artifact
from specjax.models import llama, rope, torch_files
from specjax.models.config import ModelConfig

FIELD = "config.drafter.eagle"
FORMATS = ("auto", "specjax", "eagle", "eagle3", "speculators")
EXPORTS = ("eagle", "eagle3", "speculators")
DTYPES = {"float32": np.float32, "bfloat16": jnp.bfloat16, "float16": np.float16}
NAMES = {
  "eagle": "SafeAILab EAGLE-1/2",
  "eagle3": "SafeAILab/SpecForge EAGLE-3",
  "speculators/eagle3": "vLLM speculators EAGLE-3",
  "speculators/eagle": "vLLM speculators EAGLE-1",
  "speculators/peagle": "vLLM speculators P-EAGLE",
}
# Tensors a published drafter may carry that specjax does not use (checked or ignored).
_IGNORED = ("rotary_emb.inv_freq", "verifier_norm.weight", "verifier_lm_head.weight")
_EMBED = "embed_tokens.weight"
# The layer's tensors: specjax name -> the HF name after the layer prefix (llama.SCHEMA's).
_LAYER = {p.name: p.hf.removeprefix("model.layers.{i}.") for p in llama.SCHEMA if p.per_layer}
_LAYER["hidden_norm"] = "hidden_norm.weight"
SPECULATORS_VERSION = "0.9.0"


@dataclasses.dataclass(frozen=True)
class Plan:
  """A drafter directory as read from its config and tensor headers, before its weights load:
  what it is, the EagleConfig it decodes as, and each tensor it must hold."""

  fmt: str  # eagle | eagle3 | speculators
  name: str  # the layout's readable name (NAMES)
  cfg: object  # EagleConfig
  files: tuple  # weight files
  expected: dict  # checkpoint name -> (specjax flat name, shape)
  fc_bias: bool  # eagle1: the checkpoint has fc.bias
  config: dict  # the drafter's config.json

  def describe(self) -> str:
    c = self.cfg
    layers = ", ".join(str(f) for f in c.feature_layers)
    return (
      f"EAGLE drafter layout: {self.name} ({self.fmt}; architecture {c.architecture}), "
      f"{', '.join(f.name for f in self.files)}: features [{layers}], draft vocabulary "
      f"{c.draft_vocab} of {c.target.vocab_size}, layer {c.layer.num_heads} heads x "
      f"{c.layer.head_dim}, MLP {c.mlp_width}"
    )


# --- detection ---------------------------------------------------------------------------------


def detect(directory) -> str:
  """The layout of a drafter directory: ``specjax`` (eagle.json), ``speculators``
  (``speculators_model_type`` in config.json), ``eagle3`` or ``eagle``; one clear error if it
  is none of them."""
  directory = Path(directory)
  if (directory / "eagle.json").is_file():
    return "specjax"
  if not directory.is_dir():
    raise ValueError(f"{FIELD}.path={str(directory)!r} is not a directory.")
  config = _config(directory)
  if config is None:  # neither kind: the specjax reader's error (it names medusa.json too)
    hint = (
      "point it at a directory written by task=train with objective.name=eagle (draft_final), "
      "or at a published EAGLE drafter (config.json and its weights)"
    )
    artifact.read_meta(directory, "eagle.json", 1, f"{FIELD}.path", hint)
  if "speculators_model_type" in config:
    return "speculators"
  archs = " ".join(config.get("architectures") or ())
  if "draft_vocab_size" in config or "Eagle3" in archs:
    return "eagle3"
  names = set(_header(_weight_files(directory)))
  if any(n.startswith("midlayer.") for n in names):
    return "eagle3"
  return "eagle"


def _config(directory: Path) -> dict | None:
  path = directory / "config.json"
  if not path.is_file():
    return None
  return artifact.read_json(path, FIELD)


def _weight_files(directory: Path) -> tuple[Path, ...]:
  for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
    if (directory / index).is_file():
      try:
        weight_map = json.loads((directory / index).read_text())["weight_map"]
      except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{FIELD}: {directory / index} is not a weight index ({e}).") from None
      return tuple(sorted({directory / f for f in weight_map.values()}))
  for name in ("model.safetensors", "pytorch_model.bin", "pytorch_model.pt"):
    if (directory / name).is_file():
      return (directory / name,)
  found = sorted(directory.glob("*.safetensors"))
  if found:
    return tuple(found)
  raise ValueError(
    f"{FIELD}: {directory} has a config.json but no weights (model.safetensors or "
    "pytorch_model.bin)."
  )


def _header(files) -> dict:
  """``{name: (shape, dtype)}`` from the files' headers alone (safetensors, or torch.save's zip
  pickles, read without torch and refusing any pickle that names code); a missing, truncated or
  damaged file is one error naming it."""
  out = {}
  for f in files:
    out |= {k: (tuple(i.shape), i.dtype) for k, i in torch_files.read_shapes(f).items()}
  return out


def _read(files) -> dict[str, np.ndarray]:
  tensors = {}
  for f in files:
    tensors |= torch_files.read_tensors(f)
  return tensors


# --- the plan: config.json -> EagleConfig and the expected tensors -----------------------------


def layout(directory, fmt: str = "auto", kinds: tuple = ("eagle", "eagle3")) -> dict:
  """What a drafter directory holds, from its config.json alone (no target, no weights): the
  layout (``fmt``: ``auto`` detects it; another value must match), its readable name, the
  specjax architecture it decodes as, its config and layer config; one clear error for a
  format that does not match, an EAGLE variant specjax does not compute, or no weights.
  ``kinds``: the speculators model types read (P-EAGLE's reader passes ``("peagle",)``: an
  EAGLE-3 layer with more)."""
  directory = Path(directory)
  if fmt not in FORMATS:
    raise ValueError(f"{FIELD}.format={fmt!r} is unknown; choose one of {', '.join(FORMATS)}.")
  found = detect(directory)
  if fmt not in ("auto", found):
    raise ValueError(
      f"{FIELD}.format={fmt!r}, but {FIELD}.path={str(directory)!r} holds a {found!r} "
      f"drafter ({NAMES.get(found, 'eagle.json')}): set format={found!r} or 'auto'."
    )
  out = {"fmt": found, "directory": directory}
  if found == "specjax":
    return out
  config = _config(directory)
  if found == "speculators":
    kind = config.get("speculators_model_type")
    if kind not in kinds:
      other = {"peagle": "config.drafter.name=peagle", "dflash": "config.drafter.name=dflash"}
      hint = f": read it with {other[kind]}" if kind in other else ""
      raise ValueError(
        f"{directory}/config.json: speculators_model_type={kind!r} is not a drafter this reader "
        f"reads ({', '.join(kinds)}){hint}."
      )
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
      raise ValueError(f"{directory}/config.json lacks transformer_layer_config.")
    name = NAMES[f"speculators/{kind}"]
    prefix = "transformer." if kind == "eagle" else "layers.0."
  else:
    layer, kind, name = config, found, NAMES[found]
    prefix = {"eagle3": "midlayer."}.get(found, "layers.0.")
  _refuse_flags(config, found)
  files = _weight_files(directory)
  arch = "eagle1" if kind == "eagle" else "eagle3"
  return out | dict(config=config, layer=layer, kind=kind, name=name, prefix=prefix,
                    architecture=arch, files=files)  # fmt: skip


def plan(
  directory,
  target_cfg: ModelConfig,
  fmt: str = "auto",
  kinds=("eagle", "eagle3"),
  extra=None,
  field: str = f"{FIELD}.path",
) -> Plan:
  """Reads a published drafter's config and tensor headers (no weights) and checks that it
  fits ``target_cfg``; ``fmt`` names the layout (``auto``: detected). ``kinds`` and ``extra``
  (the EagleConfig -> more expected tensors, checkpoint name -> (name, shape)) and ``field``
  (the config field errors name): P-EAGLE's."""
  from specjax.drafters.eagle import model as eagle_model

  lay = layout(directory, fmt, kinds)
  if lay["fmt"] == "specjax":
    raise ValueError(f"{directory} is a specjax drafter (eagle.json): eagle.load reads it.")
  config, layer, name = lay["config"], lay["layer"], lay["name"]
  header = _header(lay["files"])
  where = f"{field}={str(directory)!r}"
  t = target_cfg
  hidden = int(layer.get("hidden_size", 0))
  target_hidden = config.get("target_hidden_size") or hidden
  vocab = int(layer.get("vocab_size", 0) or config.get("target_vocab_size", 0))
  if (hidden, target_hidden, vocab) != (t.dim, t.dim, t.vocab_size):
    raise ValueError(
      f"{where}: this {name} drafter was made for a target of hidden size {target_hidden} "
      f"(drafter {hidden}) and vocabulary {vocab}, and cannot read this target {t.name!r} "
      f"(hidden size {t.dim}, vocabulary {t.vocab_size}): point it at a drafter for this target."
    )
  layers = int(layer.get("num_hidden_layers", 1))
  if layers != 1:
    raise ValueError(
      f"{where}: num_hidden_layers={layers}: specjax's EAGLE drafter has one decoder layer."
    )
  fields, ffn = _layer(layer, t, lay["fmt"], where)
  features, draft_vocab = (llama.FINAL,), t.vocab_size
  if lay["architecture"] == "eagle3":
    features = _features(config, t, lay["fmt"], where)
    draft_vocab = int(config.get("draft_vocab_size") or t.vocab_size)
  try:
    cfg = eagle_model.EagleConfig(
      t, features, 0 if draft_vocab == t.vocab_size else draft_vocab, ffn_dim=ffn,
      architecture=lay["architecture"], layer_fields=fields,
    )  # fmt: skip
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  fc_bias = _fc_bias(config, lay["kind"])
  expected = expected_tensors(cfg, lay["prefix"], fc_bias) | (extra(cfg) if extra else {})
  check_names(expected, header, name, where)
  return Plan(lay["fmt"], name, cfg, lay["files"], expected, fc_bias, config)


def _refuse_flags(config: dict, fmt: str) -> None:
  """Variants of EAGLE-3 / EAGLE-1 the specjax architectures do not compute: one error naming
  the flag. (``norm_output`` means opposite things in SpecForge and speculators.)"""
  refused = {"fc_norm": True, "norm_before_fc": True, "norm_before_residual": True,
             "layernorms": True}  # fmt: skip
  refused["norm_output"] = fmt == "speculators"  # SpecForge: True is the standard final norm
  what = {
    "fc_norm": "an RMSNorm on each auxiliary hidden state before fc",
    "norm_before_fc": "an RMSNorm on the concatenated auxiliary hidden states before fc",
    "norm_before_residual": "the residual taken after hidden_norm",
    "layernorms": "HASS's extra embedding and pre-head norms",
    "norm_output": "the normed output fed back"
    if fmt == "speculators"
    else "no final norm before lm_head",
  }
  for key, bad in refused.items():
    value = config.get(key)
    if key == "norm_output" and fmt != "speculators" and value is None:
      continue
    if value is not None and bool(value) == bad:
      raise ValueError(
        f"{FIELD}: this drafter's config sets {key}={value!r} ({what[key]}), which specjax's "
        f"EAGLE architectures do not compute; supported: {key}={not bad}."
      )


def _layer(layer: dict, t: ModelConfig, fmt: str, where: str):
  """``(layer_fields, ffn_dim)`` of the drafter's decoder layer (what differs from the
  target's; 0: the target's MLP width), from its HF-style config."""
  heads = int(layer.get("num_attention_heads") or t.num_heads)
  kv = int(layer.get("num_key_value_heads") or heads)
  if fmt in ("eagle", "eagle3"):  # SafeAILab's cnets: head_dim = hidden_size // heads
    head_dim = int(layer.get("head_dim") or 0) if fmt == "eagle3" else 0
    head_dim = head_dim or t.dim // heads
  else:
    head_dim = int(layer.get("head_dim") or t.dim // heads)
  model_type = layer.get("model_type", "llama")
  if model_type not in ("llama", "qwen2", "qwen3"):
    raise ValueError(f"{where}: a drafter layer of model_type={model_type!r} is unsupported.")
  act = layer.get("hidden_act", "silu")
  if act not in ("silu", "swish"):
    raise ValueError(f"{where}: hidden_act={act!r} is unsupported: specjax's MLP is SwiGLU.")
  try:
    inv_freq, factor = rope.from_hf(layer, head_dim)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  bias = bool(layer.get("attention_bias")) if fmt == "speculators" else False
  values = {
    "num_heads": heads,
    "num_kv_heads": kv,
    "head_dim": head_dim,
    "rope_theta": float(rope.parameters(layer)["rope_theta"]),
    "rope_inv_freq": inv_freq,
    "rope_attention_factor": factor,
    "rope_scaling": rope.scaling(layer),
    "norm_eps": float(layer.get("rms_norm_eps", 1e-6)),
    "qkv_bias": bool(layer.get("qkv_bias")) if fmt == "eagle" else bias,
    "out_bias": bias,
    "mlp_bias": bool(layer.get("mlp_bias")) if fmt == "speculators" else False,
    "qk_norm": model_type == "qwen3",
    "sliding_window": 0,
  }
  fields = tuple((k, v) for k, v in values.items() if getattr(t, k) != v)
  ffn = int(layer.get("intermediate_size") or t.ffn_dim)
  return fields, 0 if ffn == t.ffn_dim else ffn


def _features(config: dict, t: ModelConfig, fmt: str, where: str) -> tuple:
  """specjax feature layers of an EAGLE-3 drafter, in layer order (see the module docstring)."""
  sglang = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
  ids = config.get("eagle_aux_hidden_state_layer_ids")
  if ids is None and fmt == "speculators":
    ids = (config.get("speculators_config") or {}).get("eagle_aux_hidden_state_layer_ids")
  L = t.num_layers
  if ids is None and sglang is not None:
    into = [int(a) + 1 for a in sglang]  # SGLang adds one: its ids are layer outputs
    key = "eagle_config.eagle_aux_hidden_state_layer_ids"
  elif ids is not None:
    into, key = [int(a) for a in ids], "eagle_aux_hidden_state_layer_ids"
  else:
    into, key = [2, L // 2, L - 3], f"the default rule [2, L // 2, L - 3] (L = {L})"
  if len(set(into)) != len(into) or not all(1 <= a <= L for a in into):
    raise ValueError(
      f"{where}: auxiliary layers {into} (from {key}) must be distinct inputs of layers 1..{L} "
      f"of target {t.name!r} (hidden state a is the one fed into layer a; 0, the embeddings, "
      "is not a layer's output): set eagle_aux_hidden_state_layer_ids in the drafter's "
      "config.json."
    )
  return tuple(a - 1 for a in sorted(into))


def _fc_bias(config: dict, kind: str) -> bool:
  """Whether an EAGLE-1 checkpoint has fc's bias (SafeAILab: ``bias``, default True;
  speculators: ``fusion_bias``, default False)."""
  if kind == "eagle3":
    return False
  if "transformer_layer_config" in config:
    return bool(config.get("fusion_bias", False))
  return bool(config.get("bias", True))


def expected_tensors(cfg, prefix: str, fc_bias: bool) -> dict:
  """checkpoint name -> (specjax flat name, shape): every tensor the layout holds, shapes from
  ``eagle.model.param_shapes``."""
  from specjax.drafters.eagle import model as eagle_model

  fc = "fusion_fc" if prefix == "transformer." else "fc"
  names = {"fc": f"{fc}.weight", "fc_b": f"{fc}.bias", "fuse": "fc.weight",
           "norm": "norm.weight", "proj": "lm_head.weight", "vocab_ids": "d2t"}  # fmt: skip
  out = {}
  for name, shape in eagle_model.param_shapes(cfg).items():
    head, _, tail = name.partition(".")
    if head == "layer":
      out[prefix + _LAYER[tail]] = (name, shape)
    elif cfg.architecture == "eagle1" and name in ("proj", "vocab_ids"):
      continue  # the target's head over its whole vocabulary
    elif name == "fc_b" and not fc_bias:
      continue
    elif name == "vocab_ids" and not cfg.vocab_size:
      continue  # no d2t: the draft vocabulary is the target's
    else:
      out[names[name]] = (name, shape)
  return out


def check_names(expected: dict, found: dict, name: str, where: str) -> None:
  """Every expected tensor present with its shape, nothing unknown beside them: else one error
  listing the layout's expected names and shapes."""
  have = {k: tuple(v[0]) if isinstance(v, tuple) else tuple(np.shape(v)) for k, v in found.items()}
  missing = [k for k in expected if k not in have]
  wrong = [k for k, (_, s) in expected.items() if k in have and have[k] != tuple(s)]
  optional = {_EMBED, "t2d", "d2t"}
  unknown = [k for k in have if k not in expected and k not in optional and
             not k.endswith(_IGNORED)]  # fmt: skip
  if not (missing or wrong or unknown):
    return
  problems = [f"missing {k}" for k in missing] + [
    f"{k} is {list(have[k])}, expected {list(expected[k][1])}" for k in wrong
  ]
  problems += [f"unexpected {k} {list(have[k])}" for k in unknown]
  table = "\n".join(f"  {k} {list(s)}" for k, (_, s) in expected.items())
  raise ValueError(
    f"{where}: the {name} checkpoint does not match its config ({'; '.join(problems)}). "
    f"This layout holds:\n{table}\n(and may hold embed_tokens.weight, the target's, and t2d)."
  )


# --- loading -----------------------------------------------------------------------------------


def load(
  directory,
  target,
  fmt: str = "auto",
  kinds=("eagle", "eagle3"),
  extra=None,
  field: str = f"{FIELD}.path",
):
  """``(EagleConfig, decode params, meta)`` of a published drafter for ``target`` (a
  ``source.Model``): the layout printed, sizes and tensor names checked before its weights
  load, its embedding (if stored), vocabulary maps and stop tokens checked after (``kinds``,
  ``extra``: ``plan``'s; the extra tensors join the params under their names)."""
  p = plan(directory, target.cfg, fmt, kinds, extra, field)
  print(p.describe(), flush=True)
  where = f"{field}={str(directory)!r}"
  tensors = _read(p.files)
  check_names(p.expected, tensors, p.name, where)
  cfg = p.cfg
  if _EMBED in tensors:
    _check_embedding(tensors[_EMBED], target, where)
  flat = {}
  for ckpt, (name, _) in p.expected.items():
    if name != "vocab_ids":
      flat[name] = jnp.asarray(np.asarray(tensors[ckpt], np.float32))
  if cfg.architecture == "eagle1" and "fc_b" not in flat:
    flat["fc_b"] = jnp.zeros((cfg.target.dim,), jnp.float32)
  ids = _vocab_ids(p, tensors, where)
  artifact.check_vocab(ids, target, where)
  from specjax.drafters.eagle import model as eagle_model

  params = eagle_model.unflatten(flat)
  head = artifact.target_head(target.params, target.cfg)
  params["embed"] = target.params["embed"]
  params["vocab_ids"] = jnp.asarray(ids, jnp.int32)
  if cfg.architecture == "eagle1":
    params["proj"] = head
  meta = {"format": p.fmt, "layout": p.name, "source": str(directory), "config": p.config}
  return cfg, params, meta


def _vocab_ids(p: Plan, tensors: dict, where: str) -> np.ndarray:
  """Draft id -> target id: arange + d2t (EAGLE-3), checked against t2d where stored."""
  cfg = p.cfg
  w, v = cfg.draft_vocab, cfg.target.vocab_size
  ids = np.arange(w, dtype=np.int64)
  d2t = tensors.get("d2t")
  if d2t is not None and w < v:  # SafeAILab drops d2t when the vocabularies are equal
    if np.shape(d2t) != (w,):
      raise ValueError(f"{where}: d2t is {list(np.shape(d2t))}, expected [{w}].")
    ids = ids + np.asarray(d2t, np.int64)
  if ids.min() < 0 or ids.max() >= v or len(np.unique(ids)) != w:
    raise ValueError(
      f"{where}: d2t maps the {w} draft ids to {ids.min()}..{ids.max()}, not to distinct ids of "
      f"the target's vocabulary [0, {v}): the file is damaged or for another target."
    )
  t2d = tensors.get("t2d")
  if t2d is not None and w < v and np.asarray(t2d).any():
    t2d = np.asarray(t2d).astype(bool)
    if t2d.shape != (v,) or t2d.sum() != w or not t2d[ids].all():
      raise ValueError(
        f"{where}: t2d (target ids in the draft vocabulary) disagrees with d2t: the file is "
        "damaged."
      )
  return ids


def _check_embedding(stored, target, where: str) -> None:
  """A stored embedding must be the target's (rows sampled, to the stored dtype's rounding)."""
  embed = np.asarray(jax.device_get(target.params["embed"]), np.float32)
  stored = np.asarray(stored)
  if stored.shape != embed.shape:
    raise ValueError(
      f"{where}: the drafter's embed_tokens.weight is {list(stored.shape)}, the target's "
      f"embedding {list(embed.shape)}: it was made for another target."
    )
  rows = np.unique(np.linspace(0, embed.shape[0] - 1, 256).astype(int))
  s = stored[rows].astype(np.float32)
  if np.isnan(s).all():
    return  # never filled (speculators' placeholder): the target's is used
  e = embed[rows].astype(stored.dtype).astype(np.float32)
  if not np.allclose(s, e, rtol=1e-2, atol=1e-3 * float(np.abs(e).max() + 1e-12)):
    raise ValueError(
      f"{where}: the drafter stores an embedding (embed_tokens.weight) that differs from the "
      "target's; specjax drafters read the target's embedding, so this drafter would decode "
      "differently from its reference: it was trained for another target."
    )
