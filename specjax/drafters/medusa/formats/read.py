"""Reading Medusa heads in FasterDecoding's and vLLM's layouts (and specjax's own): the layout
detected, the sizes from the headers, every tensor checked, the heads mapped onto specjax's.
The layouts: the package docstring (``specjax/drafters/medusa/formats/__init__.py``)."""

import dataclasses
import re
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from specjax.drafters import artifact
from specjax.drafters.medusa import model as specjax_medusa
from specjax.drafters.medusa.model import HeadsConfig
from specjax.models import schema, torch_files

FIELD = specjax_medusa.FIELD
LAYOUTS = ("specjax", "medusa", "vllm_medusa")
FORMATS = ("auto",) + LAYOUTS
EXPORTS = ("medusa", "vllm_medusa")
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
CONFIG = "config.json"
MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
VLLM_FILE = "model.safetensors"
_NEEDS = {
  "specjax": f"{specjax_medusa.META_FILE} and {specjax_medusa.HEADS_FILE}",
  "medusa": " or ".join(MEDUSA_FILES),
  "vllm_medusa": f"{CONFIG} (model_type 'medusa') and *.safetensors/*.bin/*.pt weights named "
  "blocks.*/lm_heads.*",
}


@dataclasses.dataclass(frozen=True)
class Found:
  """What a directory's headers say: its layout, files, config, tensor names and the sizes of
  the heads they hold (no tensor data read)."""

  layout: str
  directory: Path
  files: tuple[Path, ...]
  config: dict
  shapes: dict  # the layout's tensor name -> torch_files.Info
  names: dict  # the layout's tensor name -> (file, name in the file)
  heads: HeadsConfig
  extra: dict  # per layout: R as saved (medusa), token_map in use, bias, logit_scale (vllm)


def detect(directory, fmt: str = "auto", field: str = f"{FIELD}.path") -> str:
  """The layout of ``directory``: ``fmt`` itself if the directory holds it, else (``auto``) the
  first of ``specjax`` (``medusa.json``), ``medusa`` (``medusa_lm_head.*``) and
  ``vllm_medusa`` (a Medusa ``config.json`` beside weights with vLLM's names) it holds."""
  if fmt not in FORMATS:
    raise ValueError(f"{FIELD}.format={fmt!r} is unknown; choose one of {', '.join(FORMATS)}.")
  d = Path(directory)
  if not d.is_dir():
    raise ValueError(
      f"{field}={str(d)!r} does not exist or is not a directory: point it at a heads directory."
    )
  held = [name for name in LAYOUTS if _holds(d, name)]
  if fmt != "auto":
    if fmt not in held:
      other = f"; it holds the {held[0]!r} layout: set {FIELD}.format=auto" if held else ""
      raise ValueError(
        f"{FIELD}.format={fmt!r}, but {field}={str(d)!r} holds no {_NEEDS[fmt]}{other}."
      )
    return fmt
  if held:
    return held[0]
  if any((d / f).is_file() for f in artifact.kinds()):  # another drafter: its own clear error
    return "specjax"
  listing = ", ".join(sorted(p.name for p in d.iterdir())[:12]) or "nothing"
  raise ValueError(
    f"{field}={str(d)!r} holds no Medusa heads specjax reads; it needs "
    + "; or ".join(f"{_NEEDS[n]} ({n})" for n in LAYOUTS)
    + f". It holds: {listing}."
  )


def _holds(d: Path, layout: str) -> bool:
  if layout == "specjax":
    return (d / specjax_medusa.META_FILE).is_file()
  if layout == "medusa":
    return any((d / f).is_file() for f in MEDUSA_FILES)
  files = _vllm_files(d)
  if not files or not (d / CONFIG).is_file():
    return False
  cfg = _config(d, required=False)
  if cfg.get("model_type") == "medusa" or "MedusaModel" in (cfg.get("architectures") or ()):
    return True
  names = torch_files.read_shapes(files[0])
  return any(_strip(n).startswith(("lm_heads.", "blocks.")) for n in names)


def _vllm_files(d: Path) -> list[Path]:
  """The weight files vLLM's loader reads: every ``*.safetensors``, else ``*.bin``, else
  ``*.pt`` (FasterDecoding's ``medusa_lm_head.*`` left out)."""
  for pattern in ("*.safetensors", "*.bin", "*.pt"):
    files = sorted(p for p in d.glob(pattern) if p.name not in MEDUSA_FILES and p.is_file())
    if files:
      return files
  return []


def _config(d: Path, required: bool = True) -> dict:
  path = d / CONFIG
  if not path.is_file():
    if required:
      raise ValueError(f"{FIELD}.path={str(d)!r} holds no {CONFIG}: copy the whole directory.")
    return {}
  return artifact.read_json(path, f"{FIELD}.path")


_strip = lambda name: name.removeprefix("medusa_heads.")  # noqa: E731 - vLLM drops this prefix


# --- reading the headers -------------------------------------------------------------------------


def peek(directory, fmt: str = "auto", field: str = f"{FIELD}.path") -> Found:
  """The layout, files and head sizes of ``directory`` from its headers alone."""
  d = Path(directory)
  layout = detect(d, fmt, field)
  if layout == "specjax":
    meta = specjax_medusa.read_meta(d, field)
    path = d / specjax_medusa.HEADS_FILE
    return Found(layout, d, (path,), meta, {}, {}, HeadsConfig(**meta["heads"]), {})
  if layout == "medusa":
    path = next(d / f for f in MEDUSA_FILES if (d / f).is_file())  # safetensors first: no pickle
    files, cfg = (path,), _config(d, required=False)
  else:
    files, cfg = tuple(_vllm_files(d)), _config(d)
  shapes, names = {}, {}
  for path in files:
    for name, info in torch_files.read_shapes(path).items():
      key = _strip(name) if layout == "vllm_medusa" else name
      if key in names:
        raise ValueError(f"{path}: tensor {name!r} is also in {names[key][0]}: keep one copy.")
      shapes[key], names[key] = info, (path, name)
  sizes = _medusa_sizes if layout == "medusa" else _vllm_sizes
  heads, extra = sizes(d, shapes, cfg, files[0])
  return Found(layout, d, files, cfg, shapes, names, heads, extra)


_LINEAR = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
_PROJ = re.compile(r"^(\d+)\.(\d+)\.weight$")


def _medusa_sizes(d: Path, shapes: dict, cfg: dict, path: Path):
  """FasterDecoding's heads: H and R from the tensor names, F and V from a projection."""
  projs = {int(m[1]): int(m[2]) for n in shapes if (m := _PROJ.match(n))}
  linears = {(int(m[1]), int(m[2])) for n in shapes if (m := _LINEAR.match(n))}
  heads = {k for k, _ in linears} | set(projs)
  if not projs:
    raise ValueError(
      f"{FIELD}.path={str(d)!r}: {path.name} holds no head projection '{{k}}.{{R}}.weight' "
      "[V, F] of FasterDecoding's layout ('{k}.{j}.linear.weight' [F, F] and "
      "'{k}.{j}.linear.bias' [F] for j < R, then '{k}.{R}.weight'); it holds "
      f"{sorted(shapes)[:8]}: if it is another layout, set {FIELD}.format."
    )
  r = max(projs.values())
  vocab, dim = _shape2(shapes[f"{min(projs)}.{projs[min(projs)]}.weight"].shape, d)
  num_heads = max(heads) + 1
  said = cfg.get("medusa_num_heads")
  if said is not None and said != num_heads:
    print(
      f"{d}/{CONFIG} says medusa_num_heads={said}; the file holds {num_heads} heads: using them"
    )
  # No residual layer (R = 0) is one identity layer here: x + SiLU(0 x + 0) = x.
  heads_cfg = HeadsConfig(dim, num_heads, vocab, vocab, max(r, 1), own_proj=True)
  return heads_cfg, {"saved_layers": r}


def _vllm_sizes(d: Path, shapes: dict, cfg: dict, path: Path):
  """vLLM's heads: sizes from config.json, read as vLLM's MedusaConfig reads it (any key with
  'num' and 'heads' is num_heads, 'num' and 'layers' num_hidden_layers; its defaults)."""
  cfg = dict(cfg)
  for k in list(cfg):
    if "num" in k and "heads" in k:
      cfg["num_heads"] = cfg.pop(k)
    elif "num" in k and "layers" in k:
      cfg["num_hidden_layers"] = cfg.pop(k)
  dim, vocab = cfg.get("hidden_size", 4096), cfg.get("vocab_size", 32001)
  num_heads, r = cfg.get("num_heads", 5), cfg.get("num_hidden_layers", 1)
  truncated = cfg.get("truncated_vocab_size") or vocab
  for name, v in (("hidden_size", dim), ("vocab_size", vocab), ("num_heads", num_heads),
                  ("num_hidden_layers", r), ("truncated_vocab_size", truncated)):  # fmt: skip
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise ValueError(f"{d / CONFIG}: {name} must be an integer >= 1, got {v!r}.")
  if truncated > vocab:
    raise ValueError(f"{d / CONFIG}: truncated_vocab_size {truncated} > vocab_size {vocab}.")
  token_map = truncated < vocab  # vLLM uses a token_map only then
  if "token_map" in shapes and not token_map:
    print(f"{d}: token_map is ignored, as vLLM ignores it (truncated_vocab_size == vocab_size)")
  extra = {
    "token_map": token_map,
    "bias": bool(cfg.get("medusa_fc_bias", False)),
    "shared_head": bool(cfg.get("original_lm_head", False)),
    "logit_scale": float(cfg.get("logit_scale", 1.0)),
  }
  return HeadsConfig(dim, num_heads, truncated, vocab, r, own_proj=True), extra


def _shape2(shape, d: Path) -> tuple[int, int]:
  if len(shape) != 2:
    raise ValueError(f"{FIELD}.path={str(d)!r}: a head projection has shape {list(shape)}, "
                     "not [V, F].")  # fmt: skip
  return int(shape[0]), int(shape[1])


def expected(found: Found) -> dict[str, tuple[tuple[int, ...], ...]]:
  """Every tensor name the layout needs for ``found.heads``, with the shapes it may have."""
  c, x = found.heads, found.extra
  f, h = c.dim, c.num_heads
  out = {}
  if found.layout == "medusa":
    for k in range(h):
      for j in range(x["saved_layers"]):
        out[f"{k}.{j}.linear.weight"] = ((f, f),)
        out[f"{k}.{j}.linear.bias"] = ((f,),)
      out[f"{k}.{x['saved_layers']}.weight"] = ((c.vocab_size, f),)
    return out
  rows = ((c.vocab_size, f),) + (((c.target_vocab_size, f),) if x["token_map"] else ())
  for k in range(h):
    for j in range(c.num_layers):
      out[f"blocks.{k}.layers.{j}.weight"] = ((f, f),)
      if x["bias"]:
        out[f"blocks.{k}.layers.{j}.bias"] = ((f,),)
    if not x["shared_head"]:
      out[f"lm_heads.{k}.weight"] = rows
  if x["shared_head"]:
    out["lm_head.weight" if "lm_head.weight" in found.shapes else "lm_heads.0.weight"] = rows
  if x["token_map"]:
    out["token_map"] = ((c.vocab_size,),)
  return out


def check_sizes(found: Found, target_cfg, field: str = f"{FIELD}.path") -> None:
  """The heads' hidden size and vocabulary must be the target's (before any weight loads)."""
  c = found.heads
  if (c.dim, c.target_vocab_size) != (target_cfg.dim, target_cfg.vocab_size):
    raise ValueError(
      f"{field}={str(found.directory)!r}: these Medusa heads ({found.layout} layout) have hidden "
      f"size {c.dim} and vocabulary {c.target_vocab_size}, and cannot read this target "
      f"{target_cfg.name!r} (hidden size {target_cfg.dim}, vocabulary {target_cfg.vocab_size}): "
      f"point {field} at heads trained for this target."
    )


def check_names(found: Found, field: str = f"{FIELD}.path") -> None:
  """A missing or misshapen tensor is one error listing every name and shape the layout needs;
  names the layout does not use are ignored (as the reference loaders ignore them), noted."""
  want = expected(found)
  missing = [n for n in want if n not in found.shapes]
  bad = [
    f"{n} {list(found.shapes[n].shape)}"
    for n in want
    if n in found.shapes and tuple(found.shapes[n].shape) not in want[n]
  ]
  if missing or bad:
    c = found.heads
    listing = "\n  ".join(f"{n} {' or '.join(str(list(s)) for s in want[n])}" for n in want)
    raise ValueError(
      f"{field}={str(found.directory)!r} ({found.layout} layout: {c.num_heads} heads of "
      f"{found.extra.get('saved_layers', c.num_layers)} residual layer(s), hidden size {c.dim}, "
      f"vocabulary {c.vocab_size}): "
      + (f"missing {missing[:8]}; " if missing else "")
      + (f"misshapen {bad[:8]}; " if bad else "")
      + f"the layout needs:\n  {listing}\nWrite the file again from the trained heads."
    )
  unused = sorted(set(found.shapes) - set(want))
  if unused:
    note = "the config does not enable medusa_fc_bias" if any(".bias" in n for n in unused) else ""
    print(f"{found.directory}: ignoring {unused[:8]} as the {found.layout} loader does {note}")


# --- reading the tensors -------------------------------------------------------------------------


def read(directory, fmt: str = "auto", target_cfg=None, field: str = f"{FIELD}.path"):
  """``(heads, params as numpy, meta)`` from any layout; with ``target_cfg``, the sizes are
  checked against it before any tensor is read. Prints the layout it found."""
  found = peek(directory, fmt, field)
  c = found.heads
  print(
    f"{field}={str(found.directory)!r}: Medusa heads in the {found.layout!r} layout "
    f"({', '.join(p.name for p in found.files)}): {c.num_heads} heads x {c.num_layers} residual "
    f"layers, hidden size {c.dim}, draft vocabulary {c.vocab_size} of {c.target_vocab_size}"
  )
  if found.layout == "specjax":
    tensors = specjax_medusa.read_tensors(found.directory)
    meta = found.config | {"layout": "specjax"}
    if target_cfg is not None:
      artifact.check_sizes(meta, c.dim, c.target_vocab_size, target_cfg, field, "heads")
    return c, dict(tensors), meta
  if target_cfg is not None:
    check_sizes(found, target_cfg, field)
  check_names(found, field)
  tensors = _read_needed(found)
  params = (_medusa_params if found.layout == "medusa" else _vllm_params)(found, tensors, field)
  meta = {
    "layout": found.layout,
    "files": [p.name for p in found.files],
    "config": found.config,
    "heads": dataclasses.asdict(c),
    "tree": None,
  }
  return c, params, meta


def _read_needed(found: Found) -> dict[str, np.ndarray]:
  want = expected(found)
  out = {}
  for path in found.files:
    tensors = torch_files.read_tensors(path)
    out |= {n: tensors[orig] for n, (p, orig) in found.names.items() if p == path and n in want}
  return {n: np.asarray(v) for n, v in out.items()}


def _f32(x) -> np.ndarray:
  return np.asarray(x).astype(np.float32)


def _medusa_params(found: Found, t: dict, field: str) -> dict:
  c, r = found.heads, found.extra["saved_layers"]
  h, f = c.num_heads, c.dim
  res_w = np.zeros((h, c.num_layers, f, f), np.float32)
  res_b = np.zeros((h, c.num_layers, f), np.float32)
  for k in range(h):
    for j in range(r):
      res_w[k, j], res_b[k, j] = _f32(t[f"{k}.{j}.linear.weight"]), _f32(t[f"{k}.{j}.linear.bias"])
      if j and not (
        np.array_equal(res_w[k, j], res_w[k, 0]) and np.array_equal(res_b[k, j], res_b[k, 0])
      ):
        raise ValueError(
          f"{field}={str(found.directory)!r}: head {k}'s residual layers {j} and 0 differ, but "
          "FasterDecoding's heads repeat one block (their layers share weights), so this file "
          "has no single reading; save distinct layers in the vllm_medusa layout instead."
        )
  proj = np.stack([_f32(t[f"{k}.{r}.weight"]) for k in range(h)])
  return {
    "res_w": res_w, "res_b": res_b, "proj": proj,
    "vocab_ids": np.arange(c.vocab_size, dtype=np.int32),
  }  # fmt: skip


def _vllm_params(found: Found, t: dict, field: str) -> dict:
  c, x = found.heads, found.extra
  h, r, f = c.num_heads, c.num_layers, c.dim
  res_w = np.stack([
    np.stack([_f32(t[f"blocks.{k}.layers.{j}.weight"]) for j in range(r)]) for k in range(h)
  ])  # fmt: skip
  res_b = np.zeros((h, r, f), np.float32)
  if x["bias"]:
    res_b = np.stack([
      np.stack([_f32(t[f"blocks.{k}.layers.{j}.bias"]) for j in range(r)]) for k in range(h)
    ])  # fmt: skip
  ids = np.arange(c.vocab_size, dtype=np.int32)
  if x["token_map"]:
    ids = np.asarray(t["token_map"])
    if ids.dtype.kind not in "iu" or ids.ndim != 1:
      raise ValueError(f"{field}={str(found.directory)!r}: token_map must be integer ids [V'].")
    ids = ids.astype(np.int64)
    if ids.min() < 0 or ids.max() >= c.target_vocab_size or len(np.unique(ids)) != len(ids):
      raise ValueError(
        f"{field}={str(found.directory)!r}: token_map must hold distinct ids in "
        f"[0, {c.target_vocab_size}) (vocab_size): write it again from the draft vocabulary."
      )
    ids = ids.astype(np.int32)
  if x["shared_head"]:
    name = "lm_head.weight" if "lm_head.weight" in t else "lm_heads.0.weight"
    heads = [t[name]] * h
  else:
    heads = [t[f"lm_heads.{k}.weight"] for k in range(h)]
  # With a token_map, vLLM takes its rows from a whole-vocabulary head.
  proj = np.stack([_f32(w)[ids] if w.shape[0] > c.vocab_size else _f32(w) for w in heads])
  if x["logit_scale"] != 1.0:  # vLLM scales the logits; P x * s = (s P) x
    proj = proj * np.float32(x["logit_scale"])
  return {"res_w": res_w, "res_b": res_b, "proj": proj, "vocab_ids": ids}


def load(directory, target, fmt: str = "auto", field: str = f"{FIELD}.path"):
  """``(heads, decode params, meta)`` for ``target`` from a directory in any layout. specjax's
  own heads load through ``drafters.medusa`` (fingerprint checked); foreign ones are checked by
  size, then by tensor names and shapes, before their tensors are read."""
  layout = detect(directory, fmt, field)
  if layout == "specjax":
    return specjax_medusa.load_saved(directory, target, field)
  heads, params, meta = read(directory, layout, target.cfg, field)
  ids = params["vocab_ids"]
  stops = sorted(target.tokenizer.stop_ids) if target.tokenizer is not None else []
  lacking = [s for s in stops if s not in set(ids.tolist())]
  if lacking:  # still lossless: the heads just never propose the end of a reply
    print(f"{field}: the heads' draft vocabulary lacks the stop token(s) {lacking}")
  params = {k: jnp.asarray(v) for k, v in params.items()}
  schema.check_shapes(specjax_medusa.SCHEMA, heads, {k: v for k, v in params.items()
                                                     if k != "vocab_ids"}, 0)  # fmt: skip
  return heads, params, meta
