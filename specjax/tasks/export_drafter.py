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

from pathlib import Path

import ml_collections

from specjax import build, drafters, results
from specjax.drafters import artifact
from specjax.models import source

FIELD = "config.export"
DTYPES = ("float32", "bfloat16", "float16")


def formats() -> dict[str, str]:
  """``{format: drafter name}``: the layouts each saved drafter family writes."""
  saved = sorted((f.name, f.saved.formats) for f in drafters.FAMILIES.values() if f.saved)
  return {fmt: name for name, formats in saved for fmt in formats}


def default_config() -> ml_collections.ConfigDict:
  """The ``export`` config section's defaults."""
  c = ml_collections.ConfigDict()
  c.path = ""  # a drafter task=train wrote (its draft_final directory)
  c.format = ""  # one of formats()
  c.out = ""  # the directory to write (new, empty, or holding only an earlier export's files)
  c.dtype = "float32"  # one of DTYPES
  for f in drafters.FAMILIES.values():  # a layout's own fields (verifier: speculators' target)
    for option in f.saved.options if f.saved else ():
      c[option] = ""
  return c


def check(config: ml_collections.ConfigDict) -> drafters.Family:
  """Every field, before anything loads; returns the saved drafter's family record."""
  source.check(config.target, "target")
  e = config.export
  known = formats()
  if e.format not in known:
    raise ValueError(f"{FIELD}.format={e.format!r} is unknown; choose one of {', '.join(known)}.")
  if e.dtype not in DTYPES:
    raise ValueError(f"{FIELD}.dtype={e.dtype!r} is unknown; choose one of {', '.join(DTYPES)}.")
  if not e.path or not Path(e.path).is_dir():
    raise ValueError(
      f"{FIELD}.path={e.path!r} is not a directory: point it at a drafter task=train wrote "
      "(its workdir's draft_final)."
    )
  saved = artifact.kinds()
  kinds = [kind for f, kind in saved.items() if (Path(e.path) / f).is_file()]
  if not kinds:
    raise ValueError(
      f"{FIELD}.path={e.path!r} holds neither {' nor '.join(saved)}: export writes "
      "drafters specjax trained (task=train's draft_final)."
    )
  if kinds[0] != known[e.format]:
    fits = [f for f, kind in known.items() if kind == kinds[0]]
    raise ValueError(
      f"{FIELD}.path={e.path!r} is a {kinds[0]} drafter, which format={e.format!r} cannot "
      f"hold: choose one of {', '.join(fits)}."
    )
  record = drafters.FAMILIES[kinds[0]]
  for option in _options():
    if e.get(option) and option not in record.saved.options:
      raise ValueError(
        f"{FIELD}.{option}={e[option]!r} is not read by format={e.format!r} (a {record.name} "
        "drafter's layout); leave it empty."
      )
  if record.saved.check_export is not None:
    record.saved.check_export(e.path, e.format, e.dtype, _given(e, record), FIELD)
  results.check_path_text(e.out, f"{FIELD}.out", "the directory to write")
  out, src = Path(e.out).resolve(), Path(e.path).resolve()
  if out == src or src in out.parents:
    raise ValueError(f"{FIELD}.out={e.out!r} is inside {FIELD}.path: write it elsewhere.")
  try:  # its folder, made if need be (the export's own is made when it is written)
    results.check_writable(str(out.parent), f"{FIELD}.out")
  except ValueError:
    raise ValueError(
      f"{FIELD}.out={e.out!r}: its folder {str(out.parent)!r} is not a directory this run can "
      "write to (or make): choose a path you can write to."
    ) from None
  artifact.check_replaceable(e.out, record.saved.writes, f"{FIELD}.out")
  return record


def _options() -> set[str]:
  return {o for f in drafters.FAMILIES.values() if f.saved for o in f.saved.options}


def _given(e, record) -> dict:
  return {o: e.get(o, "") for o in record.saved.options}


def run(config: ml_collections.ConfigDict) -> dict:
  record = check(config)
  e = config.export
  target = build.target(config)
  cfg, params, _ = record.saved.load(e.path, target, field=f"{FIELD}.path")
  written = record.saved.export(cfg, params, e.out, e.format, e.dtype, **_given(e, record))
  files = sorted(p.name for p in Path(written).iterdir())
  print(f"wrote {written} ({e.format}, {e.dtype}): {', '.join(files)}")
  return {"path": str(written), "format": e.format, "dtype": e.dtype, "files": files}
