"""The draft-model drafter (a smaller or truncated LM with its own KV cache), its training
(``objective.py``: DistillSpec's distillation) and its family record."""

from specjax.drafters import curves, family, timing
from specjax.drafters.draft_model.drafter import FIELD, DraftModel, DraftModelState
from specjax.drafters.draft_model.objective import DraftDistill
from specjax.models import llama

__all__ = ["FIELD", "FAMILY", "DraftDistill", "DraftModel", "DraftModelState"]


def _time_forwards(drafter, dparams, target_cfg, context, sizes, repeats):
  """The draft model's forwards over each T of ``sizes``, as verification runs the target's."""
  del target_cfg
  return timing.llama_forward_seconds(dparams, drafter.cfg, sorted(sizes), context,
                                      repeats)["causal"]  # fmt: skip


def _tau_by_k(config, target_name: str) -> list[dict]:
  """``{num_draft, tau}`` for every K within the step budgets, from ``auto_from``."""
  curve = curves.tau_curve(config.drafter.draft_model.auto_from, config, target_name)
  limit = min(max(curve), config.drafter.max_depth, config.drafter.max_nodes)
  return [{"num_draft": k, "tau": curve[k]} for k in sorted(curve) if k <= limit]


FAMILY = family.register(
  family.Family(
    name="draft_model",
    drafter=DraftModel,
    placement=family.Placement(
      partition_rules=lambda d: llama.RULES,  # on a decoding mesh: split like the target
      cache_model=lambda d: d.cfg,
      check_params=DraftModel.check_params,
    ),
    price=family.Price(
      forwards=DraftModel.step_forwards,
      timers={"draft_model": _time_forwards},
      sizes=DraftModel.own_sizes,
      alone=lambda d: d.cfg,
    ),
    tune=family.Tune(
      field="num_draft",
      grid=_tau_by_k,
      label=lambda g: f"K={g['num_draft']}",
      prefer=lambda g: (-g["num_draft"],),
    ),
    replay=family.Replay(drafts=DraftModel.teacher_forced_drafts),
    objective=DraftDistill,
  )
)
