"""Saved drafters (Medusa heads, EAGLE drafters) on disk: what a damaged, altered or misplaced
one gives, checked from its files before any target loads."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from configs import train_tiny
from specjax import testing
from specjax.drafters import artifact, eagle, medusa
from specjax.models import source, tiny
from specjax.trees import Tree

TREE = Tree.from_spec((2, 1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A tiny target's Medusa heads and EAGLE drafter, saved once: ``{kind: directory}``."""
  root = tmp_path_factory.mktemp("drafters")
  target = source.Model(*tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=3))
  heads, hparams = testing.medusa_drafter(target.cfg, TREE, 2, seed=4)
  medusa.save(root / "medusa", heads.heads, hparams, target, TREE)
  d, dparams = testing.eagle_drafter((target.cfg, target.params), 2, 3, 5)
  eagle.save(root / "eagle", d.cfg, dparams, target)
  return {"medusa": root / "medusa", "eagle": root / "eagle"}


def _config(kind, **fields):
  c = train_tiny.get_config()
  c.drafter.name = kind
  c.drafter[kind].update(fields)
  return c


def _check(kind, path):
  """The drafter's own config check (run by build.check before anything loads)."""
  c = _config(kind, path=str(path))
  cls = medusa.Medusa if kind == "medusa" else eagle.Eagle
  cls.check(c.drafter[kind], c)


FILES = {"medusa": medusa.HEADS_FILE, "eagle": eagle.WEIGHTS_FILE}


def _copy(src, dst, damage=None):
  dst.mkdir()
  for f in src.iterdir():
    data = bytearray(f.read_bytes())
    if damage is not None and f.suffix == ".safetensors":
      data = damage(data)
    (dst / f.name).write_bytes(bytes(data))
  return dst


def _flip_last(data):
  data[-1] ^= 0x01  # a data byte (the header comes first)
  return data


def _flip_header(data):
  data[10] ^= 0xFF  # inside the JSON header
  return data


def test_a_damaged_or_altered_drafter_file_is_refused_naming_it(saved, tmp_path):
  """A truncated file, a damaged header or one flipped data byte is one error naming the file,
  at the config check; a drafter saved before digests were recorded still loads."""
  for kind, src in saved.items():
    name = FILES[kind]
    meta = json.loads((src / f"{kind}.json").read_text())
    assert meta["sha256"][name] == artifact.sha256(src / name)  # recorded at save time
    _check(kind, src)
    cases = {
      "flip": (_flip_last, rf"{name} does not match the SHA-256 recorded"),
      "trunc": (lambda d: d[: len(d) // 2], rf"{name} is damaged or truncated"),
      "header": (_flip_header, rf"{name} is damaged or truncated"),
    }
    for what, (damage, message) in cases.items():
      path = _copy(src, tmp_path / f"{kind}_{what}", damage)
      with pytest.raises(ValueError, match=message) as e:
        _check(kind, path)
      assert str(path / name) in str(e.value) and "\n" not in str(e.value)
    old = _copy(src, tmp_path / f"{kind}_old")  # saved before digests: no "sha256" field
    (old / f"{kind}.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "sha256"}))
    _check(kind, old)
    (old / name).unlink()
    with pytest.raises(ValueError, match=rf"{name} is missing"):
      _check(kind, old)


def test_a_drafter_of_the_other_kind_or_target_is_named_before_the_target_loads(saved, monkeypatch):
  """A directory of the other kind names the drafter.name to use; Medusa heads of another
  target are refused from the target's header (as EAGLE's are), naming both targets and the
  fix; medusa.num_heads=0 is named as such, and so are a num_heads beside saved heads that is
  neither the default nor theirs, and a tree_spec beside the tree saved with them (both were
  ignored, exit 0)."""
  with pytest.raises(ValueError, match=r"holds medusa.json, not eagle.json: .*drafter.name=medusa"):
    _check("eagle", saved["medusa"])
  with pytest.raises(ValueError, match=r"holds eagle.json, not medusa.json: .*drafter.name=eagle"):
    _check("medusa", saved["eagle"])
  for num_heads in (4, 2):  # the default, or the saved heads' own: the saved heads decode
    c = _config("medusa", path=str(saved["medusa"]), num_heads=num_heads)
    medusa.Medusa.check(c.drafter.medusa, c)
  c = _config("medusa", path=str(saved["medusa"]), num_heads=7)  # was ignored (exit 0)
  message = r"medusa.num_heads=7 is for random weights .* own \(num_heads=2, from its files\)"
  with pytest.raises(ValueError, match=message):
    medusa.Medusa.check(c.drafter.medusa, c)
  c = _config("medusa", path=str(saved["medusa"]), tree_spec=(1, 1))  # the saved tree decoded
  message = (
    r"medusa.tree_spec=\(1, 1\) would not decode: the heads at .* carry their own tree "
    r"\(4 nodes\), .*set config.drafter.medusa.saved_tree=False to decode yours"
  )
  with pytest.raises(ValueError, match=message):
    medusa.Medusa.check(c.drafter.medusa, c)
  c.drafter.medusa.saved_tree = False
  medusa.Medusa.check(c.drafter.medusa, c)
  wide = tiny.tiny_config(vocab_size=64, dim=48, num_layers=3, name="wide-target")
  monkeypatch.setattr(source, "peek", lambda c: SimpleNamespace(cfg=wide, tokenizer=None))
  message = (
    r"trained on target 'tiny' \(hidden size 32, vocabulary 64\) and cannot read this target "
    r"'wide-target' \(hidden size 48, vocabulary 64\): point config.drafter.medusa.path at heads"
  )
  with pytest.raises(ValueError, match=message):
    _check("medusa", saved["medusa"])
  c = _config("medusa", num_heads=0)
  with pytest.raises(ValueError, match=r"config.drafter.medusa.num_heads must be an integer >= 1"):
    medusa.Medusa.check(c.drafter.medusa, c)


# --- task=promote: a trained run's drafter to the path that decodes it -------------------------


def _run_dir(tmp_path, saved, kind="eagle", **record):
  """A workdir as task=train leaves it: draft_final and train.json."""
  run = tmp_path / f"run_{kind}"
  run.mkdir(parents=True)
  _copy(saved[kind], run / "draft_final")
  record = {"config": {"objective": {"name": kind}, "data": {"sources": ["chitchat"]},
                       "train": {"steps": 7}}, "train_s": 90.0,
            "decode": {"init": {"tau": 1.1}, "final": {"tau": 1.4}}} | record  # fmt: skip
  (run / "train.json").write_text(json.dumps(record))
  return run


def _promote(run, to, dtype=""):
  from specjax.tasks import promote

  c = train_tiny.get_config()
  c.task = "promote"
  c.promote = promote.default_config()
  c.promote.update(run=str(run), to=str(to), dtype=dtype)
  return promote.run(c)


def test_promote_copies_the_drafter_with_its_provenance(tmp_path, saved):
  """The drafter's files arrive byte for byte beside a manifest naming the run, its data and
  steps and its held-out τ; a second promotion replaces the first."""
  run, to = _run_dir(tmp_path, saved), tmp_path / "committed" / "drafter"
  manifest = _promote(run, to)
  for f in saved["eagle"].iterdir():
    assert (to / f.name).read_bytes() == f.read_bytes()
  on_disk = json.loads((to / "manifest.json").read_text())
  assert on_disk == manifest and manifest["from"] == str(run.resolve())
  assert manifest["held_out"]["final"]["tau"] == 1.4 and manifest["steps"] == 7
  assert manifest["train_minutes"] == 1.5 and manifest["data"]["sources"] == ["chitchat"]
  assert manifest["sha256"][FILES["eagle"]] == artifact.sha256(saved["eagle"] / FILES["eagle"])
  _check("eagle", to)  # decodes from there as from the run
  assert [oct(q.stat().st_mode & 0o777) for q in (to, to / FILES["eagle"])] == ["0o755", "0o644"]
  (run / "draft_final" / "eagle.json").write_text(
    (run / "draft_final" / "eagle.json").read_text().replace("}", ', "note": 2}', 1)
  )
  _promote(run, to)
  assert '"note": 2' in (to / "eagle.json").read_text()


def test_promote_in_bfloat16_halves_the_weights_and_loads_them_as_float32(tmp_path, saved):
  """``promote.dtype = bfloat16``: the float32 tensors stored in bfloat16 (about half the
  bytes), the drafter's own digest and the manifest's updated; read back as float32 holding
  the rounded values, and it decodes from there."""
  from safetensors.numpy import load_file

  run, to = _run_dir(tmp_path, saved), tmp_path / "bf16"
  manifest = _promote(run, to, dtype="bfloat16")
  src, dst = saved["eagle"] / FILES["eagle"], to / FILES["eagle"]
  assert dst.stat().st_size < 0.6 * src.stat().st_size and manifest["dtype"] == "bfloat16"
  on_disk, before = load_file(str(dst)), load_file(str(src))
  floats = [k for k, v in before.items() if v.dtype == np.float32]
  assert floats and all(on_disk[k].dtype == jnp.bfloat16 for k in floats)
  back = artifact.read_tensors(to, FILES["eagle"])
  for k in floats:
    np.testing.assert_array_equal(back[k], before[k].astype(jnp.bfloat16).astype(np.float32))
  assert manifest["sha256"][FILES["eagle"]] == artifact.sha256(dst)
  _check("eagle", to)  # its own digest checks out


@pytest.mark.parametrize(
  "case",
  ["unfinished", "damaged", "foreign_to", "other_kind", "own_draft_final", "under_a_file",
   "other_runs_draft_final", "trailing_space"],
)  # fmt: skip
def test_promote_refuses_before_writing(tmp_path, saved, case):
  """An unfinished run, a drafter whose tensors changed since saved, a destination that is not
  a drafter of the same kind, inside the run itself (its draft_final: in bfloat16 the float32
  weights were replaced, exit 0), under a file, another training run's draft_final (its
  trained weights were replaced, exit 0) or a path ending in a space (a directory named so was
  made): one error, and the destination untouched."""
  run, to = _run_dir(tmp_path, saved), tmp_path / "to"
  message = {
    "unfinished": "has no train.json: the run has not finished",
    "damaged": "does not match the SHA-256 recorded when it was saved",
    "foreign_to": r"exists and holds \['notes.txt'\], not a eagle drafter",
    "other_kind": r"exists and holds \['heads.safetensors', 'medusa.json'\], not a eagle drafter",
    "own_draft_final": r"promote.to=.*draft_final' is inside config.promote.run: promoting there",
    "under_a_file": r"promote.to=.*a_file/drafter' lies under a file",
    "other_runs_draft_final": r"lies in another training run's workdir .*: promoting there",
    "trailing_space": r"promote.to=.*/to ' starts or ends with a space",
  }[case]
  if case == "own_draft_final":
    to = run / "draft_final"
  elif case == "under_a_file":
    (tmp_path / "a_file").write_text("keep me")
    to = tmp_path / "a_file" / "drafter"
  elif case == "other_runs_draft_final":
    other = _run_dir(tmp_path / "other", saved)
    (other / "checkpoints").mkdir()
    to = other / "draft_final"
  elif case == "trailing_space":
    to = Path(f"{to} ")
  if case == "unfinished":
    (run / "train.json").unlink()
  elif case == "damaged":
    path = run / "draft_final" / FILES["eagle"]
    path.write_bytes(bytes(_flip_last(bytearray(path.read_bytes()))))
  elif case == "foreign_to":
    to.mkdir()
    (to / "notes.txt").write_text("keep me")
  elif case == "other_kind":
    _copy(saved["medusa"], to)
  files = lambda d: {q.name: q.read_bytes() for q in d.iterdir()} if d.is_dir() else None  # noqa: E731
  before = files(to)
  with pytest.raises(ValueError, match=message):
    _promote(run, to, dtype="bfloat16" if case == "own_draft_final" else "")
  assert files(to) == before


def test_every_committed_promoted_drafter_matches_its_manifest():
  """A drafter committed by task=promote (experiments/*/*/manifest.json) holds exactly the
  files its manifest names, each with the SHA-256 recorded when it was promoted."""
  manifests = sorted((Path(__file__).parents[1] / "experiments").glob("*/*/manifest.json"))
  assert manifests, "no promoted drafter is committed"
  for path in manifests:
    manifest = json.loads(path.read_text())
    files = {f.name for f in path.parent.iterdir() if f.name != path.name}
    assert files == set(manifest["sha256"]), path
    for name, digest in manifest["sha256"].items():
      assert artifact.sha256(path.parent / name) == digest, path.parent / name


def test_a_write_replaces_only_what_it_wrote(tmp_path):
  """``artifact.atomic_directory``, under every drafter save, export and promote: a directory
  holding only the writer's own files is replaced whole; one holding anything else (a file, a
  folder), or a file in its place, is refused before anything is written, and kept as it was."""
  own = tmp_path / "own"
  own.mkdir()
  (own / "a.json").write_text("old")
  with artifact.atomic_directory(own, {"a.json", "b.bin"}) as tmp:
    (tmp / "a.json").write_text("new")
  assert [p.name for p in own.iterdir()] == ["a.json"] and (own / "a.json").read_text() == "new"
  for extra in ("notes.txt", "sub/"):
    mine = tmp_path / f"mine_{extra.strip('/')}"
    (mine / extra).parent.mkdir(parents=True, exist_ok=True)
    (mine / "a.json").write_text("mine")
    if not extra.endswith("/"):
      (mine / extra).write_text("keep me")
    else:
      (mine / extra).mkdir()
    refused = pytest.raises(ValueError, match=r"field=.* holds \['" + re.escape(extra))
    with refused, artifact.atomic_directory(mine, {"a.json"}, "field"):
      raise AssertionError("nothing is written into a refused directory")
    assert sorted(p.name for p in mine.iterdir()) == sorted(["a.json", extra.strip("/")])
    assert (mine / "a.json").read_text() == "mine"
  (tmp_path / "a_file").write_text("keep me")
  refused = pytest.raises(ValueError, match="is a file, not a directory")
  with refused, artifact.atomic_directory(tmp_path / "a_file", {"a_file"}):
    pass
  assert (tmp_path / "a_file").read_text() == "keep me"
  assert not list(tmp_path.glob(".*.tmp"))  # no temporary directory left behind
