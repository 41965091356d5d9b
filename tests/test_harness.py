"""The test harness patches nothing it tests: tests/conftest.py and the worker scripts the tests
start assign no attribute of specjax, gguf, transformers, torch, jax or a reference
implementation (a module, or a class or function imported from one), directly or through
``setattr``/``monkeypatch.setattr``, and swap no module in ``sys.modules``; and no test file
does so outside ``monkeypatch`` (which undoes it after the one test that asks)."""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
WATCHED = ("specjax", "gguf", "transformers", "torch", "jax", "jaxlib")
ORACLES = ("eagle", "medusa", "speculators", "specforge")  # scripts/install_oracles.sh
HARNESS = ("conftest.py", "train_worker.py", "decode_worker.py", "cli_worker.py")


def _watched(module: str) -> bool:
  return module.split(".")[0] in WATCHED + ORACLES


def _root(node) -> str | None:
  while isinstance(node, ast.Attribute | ast.Subscript):
    node = node.value
  return node.id if isinstance(node, ast.Name) else None


def patches(source: str, calls: bool = True) -> list[str]:
  """Each place ``source`` assigns an attribute of a watched package's module or object: the
  line and what it assigns. Imports anywhere in the file (function-level ones too) count;
  ``calls``: ``setattr`` and ``monkeypatch.setattr`` count too."""
  tree = ast.parse(source)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names |= {(a.asname or a.name).split(".")[0] for a in node.names if _watched(a.name)}
    elif isinstance(node, ast.ImportFrom) and node.module and _watched(node.module):
      names |= {a.asname or a.name for a in node.names}
  found = []
  for node in ast.walk(tree):
    targets = []
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      targets = [
        t for t in targets
        if (isinstance(t, ast.Attribute) and _root(t) in names)
        or ast.unparse(t).startswith("sys.modules")  # a module swapped for a stub
      ]  # fmt: skip
    elif calls and isinstance(node, ast.Call) and node.args:
      called = node.func
      is_setattr = (isinstance(called, ast.Name) and called.id == "setattr") or (
        isinstance(called, ast.Attribute) and called.attr == "setattr"
      )
      first = node.args[0]
      if is_setattr and (
        _root(first) in names or (isinstance(first, ast.Constant) and _watched(str(first.value)))
      ):
        targets = [node]
    found += [f"line {t.lineno}: {ast.unparse(t)}" for t in targets]
  return found


@pytest.mark.parametrize("name", HARNESS)
def test_the_harness_patches_nothing(name):
  assert patches((TESTS / name).read_text()) == []


@pytest.mark.parametrize("path", sorted(TESTS.glob("test_*.py")), ids=lambda p: p.stem)
def test_no_test_file_patches_for_longer_than_a_test(path):
  assert patches(path.read_text(), calls=False) == []


def test_conftest_is_short():
  assert len((TESTS / "conftest.py").read_text().splitlines()) <= 150


@pytest.mark.parametrize(
  "source",
  [
    # what tests/conftest.py once did, one line each
    "from specjax.models import registry\nregistry.load = cache(registry.load)",
    "import gguf\ngguf.GGUFReader = SharedReader",
    "def f():\n  from specjax.models import checkpoint\n  checkpoint._reader_class = lambda: R",
    "from specjax.models.tokenizer import Tokenizer\nTokenizer.from_gguf = classmethod(f)",
    "from jax._src import compiler\ncompiler.compile_or_get_cached = wrapped",
    "import transformers.integrations as t\nt.x.y = 1",
    "import torch\nsetattr(torch, 'load', f)",
    "def f(monkeypatch):\n  monkeypatch.setattr('specjax.models.registry.load', g)",
    # what tests/test_interop_eagle.py once did to speculators
    "import sys, types\nsys.modules['loguru'] = types.ModuleType('loguru')",
    "from speculators.convert.eagle import eagle3_legacy_model as m\nm.apply_rotary_pos_emb = f",
  ],
)
def test_a_patch_is_found(source):
  assert len(patches(source)) == 1


def test_local_assignments_are_not_patches():
  source = "import os\nos.environ['X'] = '1'\nfrom specjax import x\nc = x.config()\nc.y = 2\n"
  assert patches(source) == []
