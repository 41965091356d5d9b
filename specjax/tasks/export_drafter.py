"""``task=export_drafter``: a drafter specjax trained, written in a layout another engine serves.

    python -m specjax.run --config=configs/export_drafter.py \
      --config.export.path=results/eagle3_smollm2/draft_final --config.export.format=eagle3 \
      --config.export.out=exports/smollm2-eagle3

``export.path`` is a directory ``task=train`` wrote (``eagle.json`` or ``medusa.json``; its
target, ``config.target``, is loaded and checked against the drafter's fingerprint, since some
layouts carry tensors the drafter reads from its target). ``export.format``:

- ``eagle``: SafeAILab's EAGLE-1/2 layout (``objective.eagle.architecture = eagle1``);
- ``eagle3``: the EAGLE-3 layout SafeAILab, SpecForge and SGLang read (architecture ``eagle3``);
- ``speculators``: vLLM's ``speculators`` format of an EAGLE-3 drafter; ``export.verifier``
  names the target as speculators' loader should find it (an HF id or a local HF directory);
- ``medusa``: FasterDecoding's ``medusa_lm_head`` layout (full vocabulary only);
- ``vllm_medusa``: vLLM's Medusa layout (a reduced vocabulary as its ``token_map``).

``export.dtype`` (float32, bfloat16, float16) is the tensors' type on disk. The directory is
written whole or not at all (a temporary directory, renamed). ``docs/drafters.md`` lists the
layouts, their tensor names and what each engine reads.
"""

import importlib
import re
from pathlib import Path

import ml_collections

from specjax import build, results
from specjax.drafters import artifact
from specjax.models import source

FIELD = "config.export"
# format -> the kind of specjax drafter it writes (artifact.KINDS' names)
FORMATS = {
  "eagle": "eagle",
  "eagle3": "eagle",
  "speculators": "eagle",
  "medusa": "medusa",
  "vllm_medusa": "medusa",
}
DTYPES = ("float32", "bfloat16", "float16")


def default_config() -> ml_collections.ConfigDict:
  """The ``export`` config section's defaults."""
  c = ml_collections.ConfigDict()
  c.path = ""  # a drafter task=train wrote (its draft_final directory)
  c.format = ""  # one of FORMATS
  c.out = ""  # the directory to write (new, empty, or holding only an earlier export's files)
  c.dtype = "float32"  # one of DTYPES
  c.verifier = ""  # format=speculators: the target's HF id or local HF directory, recorded
  return c


def check(config: ml_collections.ConfigDict) -> str:
  """Every field, before anything loads; returns the drafter's kind (eagle or medusa)."""
  source.check(config.target, "target")
  e = config.export
  if e.format not in FORMATS:
    raise ValueError(f"{FIELD}.format={e.format!r} is unknown; choose one of {', '.join(FORMATS)}.")
  if e.dtype not in DTYPES:
    raise ValueError(f"{FIELD}.dtype={e.dtype!r} is unknown; choose one of {', '.join(DTYPES)}.")
  if not e.path or not Path(e.path).is_dir():
    raise ValueError(
      f"{FIELD}.path={e.path!r} is not a directory: point it at a drafter task=train wrote "
      "(its workdir's draft_final)."
    )
  kinds = [kind for f, kind in artifact.KINDS.items() if (Path(e.path) / f).is_file()]
  if not kinds:
    raise ValueError(
      f"{FIELD}.path={e.path!r} holds neither {' nor '.join(artifact.KINDS)}: export writes "
      "drafters specjax trained (task=train's draft_final)."
    )
  if kinds[0] != FORMATS[e.format]:
    fits = [f for f, kind in FORMATS.items() if kind == kinds[0]]
    raise ValueError(
      f"{FIELD}.path={e.path!r} is a {kinds[0]} drafter, which format={e.format!r} cannot "
      f"hold: choose one of {', '.join(fits)}."
    )
  _check_shapes(kinds[0], e)
  _check_verifier(e)
  if not e.out:
    raise ValueError(f"{FIELD}.out is empty: name the directory to write.")
  out, src = Path(e.out).resolve(), Path(e.path).resolve()
  if out == src or src in out.parents:
    raise ValueError(f"{FIELD}.out={e.out!r} is inside {FIELD}.path: write it elsewhere.")
  results.check_writable(str(out.parent), f"{FIELD}.out")
  layouts = importlib.import_module(f"specjax.drafters.{kinds[0]}.formats")
  artifact.check_replaceable(e.out, layouts.WRITES, f"{FIELD}.out")
  return kinds[0]


def _check_shapes(kind: str, e) -> None:
  """What the saved drafter's JSON says against what ``e.format`` can hold."""
  if kind == "eagle":
    from specjax.drafters import eagle
    from specjax.drafters.eagle import formats as layouts

    cfg = eagle.EagleConfig.fromdict(eagle.read_meta(e.path, f"{FIELD}.path")["eagle"])
    layouts.check_export(cfg, e.format, e.dtype, e.verifier)
  if kind == "medusa" and e.format == "medusa":
    from specjax.drafters import medusa

    heads = medusa.read_meta(e.path, f"{FIELD}.path")["heads"]
    if heads["vocab_size"] < heads["target_vocab_size"]:
      raise ValueError(
        f"{FIELD}.path={e.path!r} has a reduced draft vocabulary ({heads['vocab_size']} of "
        f"{heads['target_vocab_size']}), which FasterDecoding's layout cannot hold: set "
        f"{FIELD}.format=vllm_medusa (its token_map holds it)."
      )


def _check_verifier(e) -> None:
  """``export.verifier``: only speculators records one; a local directory must be an HF model's,
  anything else an HF id (``org/name``)."""
  if not e.verifier:
    return
  if e.format != "speculators":
    raise ValueError(
      f"{FIELD}.verifier={e.verifier!r} is recorded by format=speculators only; leave it empty "
      f"for format={e.format!r}."
    )
  path = Path(e.verifier)
  if path.exists():
    if not (path / "config.json").is_file():
      raise ValueError(
        f"{FIELD}.verifier={e.verifier!r} is a local path without config.json: name the "
        "target's HF directory (or its HF id, org/name)."
      )
  elif not re.fullmatch(r"[\w.-]+/[\w.-]+", e.verifier):
    raise ValueError(
      f"{FIELD}.verifier={e.verifier!r} is neither a local directory nor an HF id (org/name): "
      "name the target as speculators' loader should find it."
    )


def run(config: ml_collections.ConfigDict) -> dict:
  kind = check(config)
  e = config.export
  target = build.target(config)
  drafter = importlib.import_module(f"specjax.drafters.{kind}")
  layouts = importlib.import_module(f"specjax.drafters.{kind}.formats")
  cfg, params, _ = drafter.load(e.path, target, field=f"{FIELD}.path")
  extra = {"verifier": e.verifier} if kind == "eagle" else {}
  written = layouts.export(cfg, params, e.out, e.format, e.dtype, **extra)
  files = sorted(p.name for p in Path(written).iterdir())
  print(f"wrote {written} ({e.format}, {e.dtype}): {', '.join(files)}")
  return {"path": str(written), "format": e.format, "dtype": e.dtype, "files": files}
