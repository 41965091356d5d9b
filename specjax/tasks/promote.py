"""``task=promote``: a trained drafter copied to the path that decodes it, with its provenance.

    python -m specjax.run --config=experiments/eagle_smollm2/config.py:promote
    python -m specjax.run --config=experiments/eagle_smollm2/config.py:promote \
      --config.promote.run=results/my_run --config.promote.to=drafters/mine

``promote.run`` is a workdir ``task=train`` wrote; its ``draft_final`` (an EAGLE drafter or
Medusa heads) goes to ``promote.to``, the directory an experiment's variants or README's commands
decode from, replacing the drafter there. Checked before anything is written: the run finished
(``train.json`` and ``draft_final`` are there), the drafter's tensors still have the SHA-256
recorded when they were saved, and ``promote.to`` is absent, empty or a drafter of the same kind
(a directory holding anything else is never replaced). Written whole or not at all, with
``manifest.json``: the run it came from, its objective, data, steps and training time, the
held-out τ and target calls its training run measured before and after (``train.json``'s
``decode``), each file's SHA-256, and when. ``promote.dtype = "bfloat16"`` stores the float32
weights in bfloat16 (half the size; loading reads them back as float32, and a run in either
dtype casts them as it casts any drafter), the saved drafter's own SHA-256 updated.
"""

import datetime
import json
import shutil
from pathlib import Path

import ml_collections

from specjax import results
from specjax.drafters import artifact
from specjax.tasks import train

FIELD = "config.promote"
MANIFEST = "manifest.json"


def default_config() -> ml_collections.ConfigDict:
  """The ``promote`` config section's defaults."""
  c = ml_collections.ConfigDict()
  c.run = ""  # a workdir task=train wrote (it holds draft_final/ and train.json)
  c.to = ""  # the directory to write (an existing drafter there is replaced)
  c.dtype = ""  # "" = the weights as saved; "bfloat16": stored in bfloat16 (half the bytes)
  return c


def check(config: ml_collections.ConfigDict) -> tuple[Path, str, dict]:
  """``(draft_final, its kind, train.json)``, every field checked before anything is written."""
  if "promote" not in config:
    raise ValueError(
      "task=promote needs a config.promote section: c.promote = "
      "specjax.tasks.promote.default_config(), with run and to set."
    )
  p = config.promote
  run = Path(p.run)
  if not p.run or not run.is_dir():
    raise ValueError(f"{FIELD}.run={p.run!r} is not a directory: name a workdir task=train wrote.")
  draft, record = run / "draft_final", run / "train.json"
  if not draft.is_dir() or not record.is_file():
    missing = " and ".join(str(x.name) for x in (draft, record) if not x.exists())
    raise ValueError(
      f"{FIELD}.run={p.run!r} has no {missing}: the run has not finished (rerun its task=train; "
      "it resumes from its newest checkpoint)."
    )
  kind = _kind(draft, f"{FIELD}.run")
  meta = artifact.read_json(draft / f"{kind}.json", f"{FIELD}.run")
  for name, digest in (meta.get("sha256") or {}).items():
    artifact.check_tensors(draft / name, digest, f"{FIELD}.run")
  if p.get("dtype", "") not in ("", "bfloat16"):
    raise ValueError(f"{FIELD}.dtype={p.dtype!r} is unknown; choose '' (as saved) or 'bfloat16'.")
  results.check_path_text(p.to, f"{FIELD}.to", "the directory the drafter is decoded from")
  to = Path(p.to)
  dest, source = to.resolve(), run.resolve()
  if dest == source or source in dest.parents:
    raise ValueError(
      f"{FIELD}.to={p.to!r} is inside {FIELD}.run: promoting there would replace the run's own "
      "files (draft_final's weights among them); promote to a directory outside the run."
    )
  if any(q.exists() and not q.is_dir() for q in dest.parents):
    raise ValueError(f"{FIELD}.to={p.to!r} lies under a file: choose a directory path.")
  if train.is_run(dest.parent):
    raise ValueError(
      f"{FIELD}.to={p.to!r} lies in another training run's workdir ({str(to.parent)!r}): "
      "promoting there would replace that run's own drafter; promote to a directory outside "
      "any run (e.g. an experiment's drafter folder)."
    )
  if to.exists():
    held = sorted(q.name for q in to.iterdir()) if to.is_dir() else [to.name]
    if held and (not to.is_dir() or _kind(to, f"{FIELD}.to", strict=False) != kind):
      raise ValueError(
        f"{FIELD}.to={p.to!r} exists and holds {held[:6]}, not a {kind} drafter: promote into "
        "a new directory, or the one the drafter was promoted to before."
      )
  return draft, kind, artifact.read_json(record, f"{FIELD}.run")


def _narrow(directory: Path, kind: str) -> None:
  """The drafter's weights files (those its meta file records a SHA-256 for) in bfloat16, the
  meta file's digests updated."""
  meta_path = directory / f"{kind}.json"
  meta = json.loads(meta_path.read_text())
  meta["sha256"] = {name: artifact.narrowed(directory, name) for name in meta.get("sha256", {})}
  meta_path.write_text(json.dumps(meta, indent=1) + "\n")


def _kind(directory: Path, field: str, strict: bool = True) -> str | None:
  kinds = [kind for f, kind in artifact.kinds().items() if (directory / f).is_file()]
  if not kinds and strict:
    raise ValueError(
      f"{field}: {directory} holds neither {' nor '.join(artifact.kinds())}: not a drafter "
      "task=train saved."
    )
  return kinds[0] if kinds else None


def run(config: ml_collections.ConfigDict) -> dict:
  draft, kind, record = check(config)
  p = config.promote
  trained = record.get("config", {})
  manifest = {
    "from": str(Path(p.run).resolve()),
    "kind": kind,
    "objective": trained.get("objective", {}).get("name"),
    "data": {k: trained.get("data", {}).get(k) for k in ("sources", "files", "max_examples")},
    "steps": trained.get("train", {}).get("steps"),
    "train_minutes": round(record["train_s"] / 60, 1) if "train_s" in record else None,
    "held_out": record.get("decode"),  # tau and target calls before and after training
    "sha256": {f.name: artifact.sha256(f) for f in sorted(draft.iterdir()) if f.is_file()},
    "promoted": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
  }
  files = {f.name for f in draft.iterdir() if f.is_file()}
  with artifact.atomic_directory(p.to, files | {MANIFEST}, f"{FIELD}.to") as tmp:
    for f in draft.iterdir():
      if f.is_file():
        shutil.copy2(f, tmp / f.name)
    if p.get("dtype"):
      _narrow(tmp, kind)
      manifest["dtype"] = p.dtype
      manifest["sha256"] = {f.name: artifact.sha256(f) for f in sorted(tmp.iterdir())}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
  tau = (manifest["held_out"] or {}).get("final", {}).get("tau")
  print(f"promoted {draft} -> {p.to} ({kind}" + (f", held-out τ {tau:.3f})" if tau else ")"))
  return manifest
