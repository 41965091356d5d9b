"""Export a drafter specjax trained for vLLM, SGLang or the reference EAGLE/Medusa code
(task=export_drafter; the layouts and what each engine reads: docs/drafters.md).

    python -m specjax.run --config=configs/export_drafter.py \
      --config.export.path=results/eagle3_smollm2/draft_final --config.export.format=eagle3 \
      --config.export.out=exports/smollm2-eagle3 [--config.export.dtype=bfloat16]

The target is SmolLM2-135M-Instruct (the drafter must have been trained on it: its fingerprint
is checked); another target: ``--config.target.source=safetensors --config.target.path=DIR``.
Formats: eagle | eagle3 | speculators (EAGLE drafters; speculators also takes
``--config.export.verifier=HF_ID_OR_DIR``, the target as its loader finds it), medusa |
vllm_medusa (Medusa heads).
``:tiny`` uses configs/tiny.py's random target (tests).
"""

from configs import demo, tiny
from specjax.tasks import export_drafter


def get_config(arg: str = ""):
  if arg not in ("", "tiny"):
    raise ValueError(f"configs/export_drafter.py takes no argument or ':tiny', got {arg!r}.")
  c = demo.base() if arg == "" else tiny.get_config()
  c.task = "export_drafter"
  c.export = export_drafter.default_config()
  return c
