"""The saved curves a drafter's ``auto`` budget is chosen from: readers of a
``cost_model.json`` (``task=cost_model`` writes it). Each names the config field it serves and
fails with one clear error when the file was measured for another target or holds nothing for
this drafter. Drafters check their ``auto_from`` file here, below the cost model that prices
them (``costmodel.py`` reads the same curves), so no drafter imports the cost model.
"""

import json
from pathlib import Path

COST_MODEL_KEYS = ("config", "target", "rows")  # what every cost_model.json holds


def read_cost_model(path, field: str) -> dict:
  """The record of a ``cost_model.json``; a file that is not JSON, or JSON that is not a
  cost_model.json, is one error naming ``field`` and the file."""
  fix = "point it at the cost_model.json that task=cost_model writes"
  try:
    record = json.loads(Path(path).read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{field}={str(path)!r} is not valid JSON ({e}): {fix}.") from None
  missing = [k for k in COST_MODEL_KEYS if not isinstance(record, dict) or k not in record]
  if missing:
    raise ValueError(
      f"{field}={str(path)!r} is not a cost_model.json (it has no {', '.join(missing)}): {fix}."
    )
  return record


def _draft_fields(drafter_config: dict) -> dict:
  """What identifies a draft model in a config: its source, truncation depth or model."""
  c = drafter_config.get("draft_model", {})
  fields = {"source": c.get("source")}
  if c.get("source") == "truncate":
    fields["num_layers"] = c.get("num_layers")
  else:
    m = c.get("model", {})
    fields["model"] = {k: m.get(k) for k in ("source", "name", "path")}
  return fields


def record_for(path, field: str, target_name: str) -> dict:
  """A ``cost_model.json``; a clear error (naming ``field``) if another target was measured."""
  record = read_cost_model(path, field)
  if record.get("target") != target_name:
    raise ValueError(
      f"{field}={path!r} was measured for target {record.get('target')!r}, not "
      f"{target_name!r}: run task=cost_model with this target."
    )
  return record


def tau_curve(path, config, target_name: str) -> dict[int, float]:
  """``{K: τ}`` for this config's draft model from a ``cost_model.json``; a clear error if the
  file holds none for this target and draft model."""
  field = "config.drafter.draft_model.auto_from"
  record = record_for(path, field, target_name)
  base = record["config"]["drafter"]
  want = _draft_fields(config.drafter.to_dict())
  for row in record["rows"]:
    merged = {**base, "draft_model": {**base.get("draft_model", {}),
                                      **row["drafter"].get("draft_model", {})}}  # fmt: skip
    is_draft = row["drafter"].get("name") == "draft_model" and row.get("tau_by_k")
    if is_draft and _draft_fields(merged) == want:
      return {int(k): v for k, v in row["tau_by_k"].items()}
  raise ValueError(
    f"{field}={path!r} has no tau_by_k for draft model {want}: run task=cost_model with a "
    "draft_model variant of this draft."
  )


def lookup_curve(path, target_name: str) -> list[dict]:
  """The ``lookup_grid`` of a ``cost_model.json``; a clear error if it has none for this
  target."""
  field = "config.drafter.prompt_lookup.auto_from"
  record = record_for(path, field, target_name)
  if not record.get("lookup_grid"):
    raise ValueError(
      f"{field}={path!r} has no lookup_grid: run task=cost_model with a prompt_lookup variant."
    )
  return record["lookup_grid"]


def eagle_grid(path, target_name: str, drafter_path: str) -> list[dict]:
  """The ``eagle_grid`` rows of a ``cost_model.json`` for the drafter saved at
  ``drafter_path``; a clear error if it has none for this target and drafter."""
  field = "config.drafter.eagle.auto_from"
  record = record_for(path, field, target_name)
  same = lambda p: Path(p).resolve() == Path(drafter_path).resolve()  # noqa: E731
  grid = [g for g in record.get("eagle_grid") or [] if same(g["path"])]
  if not grid:
    raise ValueError(
      f"{field}={path!r} has no eagle_grid for the drafter {str(drafter_path)!r}: run "
      "task=cost_model with an eagle variant of this drafter."
    )
  return grid


def block_grid(path, name: str, target_name: str, drafter_path: str, lookup: int) -> list[dict]:
  """The ``block_grid`` rows of a ``cost_model.json`` for the ``name`` drafter (a static-tree
  family: DFlash, P-EAGLE) saved at ``drafter_path`` with a ``lookup``-token branch; a clear
  error if it has none for this target, drafter and branch."""
  field = f"config.drafter.{name}.auto_from"
  record = record_for(path, field, target_name)
  same = lambda p: Path(p).resolve() == Path(drafter_path).resolve()  # noqa: E731
  grid = [
    g
    for g in record.get("block_grid") or []
    if g["family"] == name and same(g["path"]) and g["lookup"] == lookup
  ]
  if not grid:
    raise ValueError(
      f"{field}={path!r} has no block_grid for the {name} drafter {str(drafter_path)!r} with "
      f"lookup={lookup}: run task=cost_model with a {name} variant of this drafter and branch."
    )
  return grid


def within_budget(grid: list[dict], config, name: str, what: str, nodes: str) -> list[dict]:
  """The trees of ``grid`` (rows with ``depth`` and, under ``nodes``, their node count) within
  ``config.drafter.max_depth`` and ``max_nodes``; none is one error naming
  ``config.drafter.<name>.auto_from`` and ``what`` it holds."""
  c = config.drafter
  out = [g for g in grid if g["depth"] <= c.max_depth and g[nodes] <= c.max_nodes]
  if not out:
    raise ValueError(
      f"config.drafter.{name}.auto_from={c[name].auto_from!r}: no {what} fits "
      f"config.drafter.max_depth={c.max_depth} and max_nodes={c.max_nodes}; raise them."
    )
  return out
