"""task=export_drafter: specjax-trained drafters written in the layouts other engines serve.

The layouts themselves (tensor names, the reference loaders' logits) are tested in
test_interop_medusa.py and test_interop_eagle.py; here the task: its checks, before any weight
loads, and that what it writes reads back as the drafter it was given.
"""

import json

import numpy as np
import pytest

from configs import export_drafter as export_config
from specjax import build, testing
from specjax.drafters import eagle, medusa
from specjax.tasks import export_drafter
from specjax.trees import Tree

TREE = Tree.from_spec((2, 2))


def _config(tmp_path, **export):
  c = export_config.get_config("tiny")
  c.target.update(vocab_size=64, dim=32, num_layers=3, num_heads=2, num_kv_heads=1, ffn_dim=64)
  c.export.update(export)
  return c


def _medusa_heads(tmp_path, vocab_ids=None):
  c = _config(tmp_path)
  target = build.target(c)
  drafter, params = testing.medusa_drafter(target.cfg, TREE, 3, vocab_ids, seed=4)
  medusa.save(tmp_path / "heads", drafter.heads, params, target, TREE)
  return target, drafter.heads, params


@pytest.mark.parametrize("fmt, reduced", [("medusa", False), ("vllm_medusa", True)])
def test_medusa_heads_export_and_read_back_bit_identical(tmp_path, fmt, reduced):
  from specjax.drafters.medusa import formats as layouts

  ids = tuple(range(0, 64, 2)) if reduced else None
  target, heads, params = _medusa_heads(tmp_path, ids)
  c = _config(tmp_path, path=str(tmp_path / "heads"), format=fmt, out=str(tmp_path / "out"))
  record = export_drafter.run(c)
  assert record["format"] == fmt and record["files"]
  assert layouts.detect(tmp_path / "out") == fmt
  got_heads, got, _ = layouts.load(tmp_path / "out", target)
  assert (got_heads.num_heads, got_heads.vocab_size) == (heads.num_heads, heads.vocab_size)
  for name in ("res_w", "res_b", "proj", "vocab_ids"):
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(params[name]))


def _eagle_drafter(tmp_path, architecture):
  c = _config(tmp_path)
  target = build.target(c)
  ids = tuple(range(0, 64, 2))
  drafter, params = testing.eagle_drafter(
    (target.cfg, target.params), 2, 2, 3, ids, features=(0, 1, 2), architecture=architecture
  )
  eagle.save(tmp_path / f"eagle_{architecture}", drafter.cfg, params, target)
  return target, drafter.cfg, params


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
def test_a_trained_eagle3_exports_and_reads_back_bit_identical(tmp_path, fmt):
  target, cfg, params = _eagle_drafter(tmp_path, "eagle3")
  out = str(tmp_path / "out")
  verifier = "HuggingFaceTB/SmolLM2-135M-Instruct" if fmt == "speculators" else ""
  c = _config(tmp_path, path=str(tmp_path / "eagle_eagle3"), format=fmt, out=out,
              verifier=verifier)  # fmt: skip
  assert export_drafter.run(c)["format"] == fmt
  if verifier:  # recorded as given
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == verifier
  got_cfg, got, meta = eagle.load(out, target)
  assert got_cfg == cfg and meta["format"] == fmt
  for name in ("fuse", "proj", "vocab_ids", "norm"):
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(params[name]))
  for name, w in params["layer"].items():
    np.testing.assert_array_equal(np.asarray(got["layer"][name]), np.asarray(w))


def _bad(tmp_path):
  _medusa_heads(tmp_path)
  _eagle_drafter(tmp_path, "specjax")
  _eagle_drafter(tmp_path, "eagle3")
  heads, out = str(tmp_path / "heads"), str(tmp_path / "out")
  return {
    "specjax's EAGLE architecture for vLLM": (
      "architecture is 'specjax'",
      dict(path=str(tmp_path / "eagle_specjax"), format="speculators", out=out),
    ),
    "unknown format": ("export.format='onnx' is unknown", dict(path=heads, format="onnx", out=out)),
    "unknown dtype": (
      "export.dtype='int8'",
      dict(path=heads, format="medusa", out=out, dtype="int8"),
    ),
    "no drafter there": (
      "holds neither dflash.json nor eagle.json nor medusa.json",
      dict(path=str(tmp_path), format="medusa", out=out),
    ),
    "an EAGLE format for Medusa heads": (
      "is a medusa drafter, which format='eagle3' cannot hold: choose one of medusa, vllm_medusa",
      dict(path=heads, format="eagle3", out=out),
    ),
    "output inside the drafter": (
      "is inside config.export.path",
      dict(path=heads, format="medusa", out=f"{heads}/export"),
    ),
    "no output": ("export.out is empty", dict(path=heads, format="medusa")),
    "output a space": (  # a directory 'out ' was made, and ' ' in the working directory
      "/out ' starts or ends with a space, which would be part of the name",
      dict(path=heads, format="medusa", out=f"{out} "),
    ),
    "output starting with ~": (  # a directory named '~' was made in the working directory
      "export.out='~/exp' starts with ~, which the shell leaves as it is",
      dict(path=heads, format="medusa", out="~/exp"),
    ),
    "output in a folder that cannot be written": (  # was named as export.out='/proc'
      "export.out='/proc/specjax-out': its folder '/proc' is not a directory this run can write",
      dict(path=heads, format="medusa", out="/proc/specjax-out"),
    ),
    "speculators without a verifier": (
      "export.verifier is empty",
      dict(path=str(tmp_path / "eagle_eagle3"), format="speculators", out=out),
    ),
    "a verifier for a format without one": (
      "is not read by format='vllm_medusa'",
      dict(path=heads, format="vllm_medusa", out=out, verifier="org/model"),
    ),
    "a verifier that is no model": (
      "local path without config.json",
      dict(
        path=str(tmp_path / "eagle_eagle3"), format="speculators", out=out, verifier=str(tmp_path)
      ),
    ),
    "a verifier that is no HF id": (
      "neither a local directory nor an HF id",
      dict(
        path=str(tmp_path / "eagle_eagle3"), format="speculators", out=out, verifier="no such model"
      ),
    ),
  }


BAD = [
  "specjax's EAGLE architecture for vLLM", "unknown format", "unknown dtype", "no drafter there",
  "an EAGLE format for Medusa heads", "output inside the drafter", "no output",
  "output a space", "output starting with ~", "output in a folder that cannot be written",
  "speculators without a verifier", "a verifier for a format without one",
  "a verifier that is no model",
  "a verifier that is no HF id",
]  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_clear_error_before_the_target_loads(tmp_path, case, monkeypatch):
  text, export = _bad(tmp_path)[case]

  def no_target(config):
    raise AssertionError("the target loaded before the export config was checked")

  monkeypatch.setattr(build, "target", no_target)
  with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
    export_drafter.run(_config(tmp_path, **export))
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["eagle3", "vllm_medusa"])
def test_an_export_never_deletes_what_the_user_keeps(tmp_path, fmt, monkeypatch):
  """``export.out`` naming a folder of the user's (a notes file beside what an export writes),
  or a file, is one error naming the field, before the target loads; both stay as they were. A
  folder holding only an earlier export's files is replaced, as re-exporting needs."""
  _medusa_heads(tmp_path, tuple(range(0, 64, 2)))
  _eagle_drafter(tmp_path, "eagle3")
  path = str(tmp_path / ("eagle_eagle3" if fmt == "eagle3" else "heads"))
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "NOTES.txt").write_text("keep me")
  (mine / "config.json").write_text("{}")
  a_file = tmp_path / "a_file"
  a_file.write_text("keep me too")

  def no_target(config):
    raise AssertionError("the target loaded before export.out was checked")

  with monkeypatch.context() as m:
    m.setattr(build, "target", no_target)
    with pytest.raises(ValueError, match=r"export.out=.*mine.* holds \['NOTES.txt'\]"):
      export_drafter.run(_config(tmp_path, path=path, format=fmt, out=str(mine)))
    with pytest.raises(ValueError, match=r"export.out=.*a_file.* is a file"):
      export_drafter.run(_config(tmp_path, path=path, format=fmt, out=str(a_file)))
  assert sorted(p.name for p in mine.iterdir()) == ["NOTES.txt", "config.json"]
  assert (mine / "NOTES.txt").read_text() == "keep me" and a_file.read_text() == "keep me too"
  out = tmp_path / "out"
  again = _config(tmp_path, path=path, format=fmt, out=str(out))
  first = export_drafter.run(again)["files"]
  assert export_drafter.run(again)["files"] == first


def test_a_drafter_of_another_target_is_named_by_the_export_field(tmp_path):
  """Heads trained for another target: the error names config.export.path, the field the user
  set, not the decode config's drafter path."""
  _medusa_heads(tmp_path)
  c = _config(tmp_path, path=str(tmp_path / "heads"), format="vllm_medusa", out=str(tmp_path / "o"))
  c.target.seed = 9
  with pytest.raises(ValueError, match=r"^config\.export\.path='.*heads'"):
    export_drafter.run(c)
  assert not (tmp_path / "o").exists()
