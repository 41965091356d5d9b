"""specjax's modules import one another without a circle, function-level imports included, and
the drafters sit below the cost model and the simulator (which price and replay them)."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specjax"


def _modules() -> dict[str, Path]:
  out = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return out


def _imported(name: str, path: Path, modules: dict) -> set[str]:
  """The specjax modules ``name`` imports anywhere in its file (``from pkg import mod`` counts
  as ``pkg.mod`` where that is a module, else as ``pkg``)."""
  out = set()
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
      out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
  return (out & set(modules)) - {name}


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imported(name, path, modules) for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_no_import_circle():
  graph = _graph()
  assert len(graph) > 50 and "specjax.drafters.eagle.layouts" in graph
  assert _circles(graph) == []


def test_a_circle_is_found():
  """The check itself: a model that imported its package's published layouts back (as
  ``drafters/eagle/model.py`` once did) is a circle."""
  graph = _graph()
  graph["specjax.drafters.eagle.model"] = graph["specjax.drafters.eagle.model"] | {
    "specjax.drafters.eagle.formats"
  }
  assert any("specjax.drafters.eagle.formats" in c for c in _circles(graph))


@pytest.mark.parametrize("above", ["specjax.costmodel", "specjax.simulate"])
def test_drafters_do_not_import_what_prices_them(above):
  graph = _graph()
  assert not [m for m, deps in graph.items() if m.startswith("specjax.drafters") and above in deps]


# --- the direction of docs/design.md's module list ---------------------------------------------

DESIGN = PACKAGE.parent / "docs" / "design.md"


def _layers() -> list[set[str]]:
  """docs/design.md's module list, top to bottom: each entry's modules (``run.py -> tasks/*``:
  specjax.run and specjax.tasks; ``models/``: the package); an entry whose names end in a comma
  goes on on the next line."""
  text = DESIGN.read_text()
  block = text.split("## Modules and their direction", 1)[1].split("```")[1]
  layers, goes_on = [], False
  for line in block.strip("\n").splitlines():
    column = line[:30].rstrip()
    names = re.findall(r"([a-z_]+)(?:\.py|/\*?)", column)
    if not names:
      continue
    modules = {f"specjax.{n}" for n in names}
    if goes_on:
      layers[-1] |= modules
    else:
      layers.append(modules)
    goes_on = column.endswith(",")
  return layers


def _layer_of(module: str, layers) -> int | None:
  for i, names in enumerate(layers):
    if any(module == n or module.startswith(n + ".") for n in names):
      return i
  return None


def _upward(graph, layers) -> set[tuple[str, str]]:
  return {
    (m, d) for m, deps in graph.items() for d in deps
    if _layer_of(m, layers) is not None and _layer_of(d, layers) is not None
    and _layer_of(d, layers) < _layer_of(m, layers)
  }  # fmt: skip


def test_every_module_is_on_the_design_pages_list():
  layers = _layers()
  assert len(layers) >= 15
  unplaced = sorted(m for m in _graph() if m != "specjax" and _layer_of(m, layers) is None)
  assert unplaced == []


def test_imports_point_down_the_design_pages_list():
  """Every import (function-level ones too) goes to a module on the same line of the list or
  below it."""
  assert _upward(_graph(), _layers()) == set()


def test_an_import_back_up_is_found():
  graph = _graph()
  graph["specjax.models.checkpoint"] = graph["specjax.models.checkpoint"] | {"specjax.train"}
  assert ("specjax.models.checkpoint", "specjax.train") in _upward(graph, _layers())
