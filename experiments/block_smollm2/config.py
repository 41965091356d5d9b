"""Block drafters on SmolLM2-135M-Instruct: DFlash trained on the data and step budget of
EAGLE's ``:requests``, decoded beside it on the held-out prompts.

    bash scripts/install_models.sh smollm2 && bash scripts/install_corpora.sh all
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:greedy
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:requests
    python -m specjax.run --config=experiments/block_smollm2/config.py                # 1.
    python -m specjax.run --config=experiments/block_smollm2/config.py:requests       # 2.
    python -m specjax.run --config=experiments/block_smollm2/config.py:promote        # to drafter/
    python -m specjax.run --config=experiments/block_smollm2/config.py:sweep_requests # 3.
    python experiments/block_smollm2/step_cost.py                                     # 4.
    python -m specjax.run --config=experiments/eagle_smollm2/config.py:eagle3_serve   # for 5.
    python -m specjax.run --config=experiments/block_smollm2/config.py:peagle         # 5.
    python -m specjax.run --config=experiments/block_smollm2/config.py:promote_peagle
    python -m specjax.run --config=experiments/block_smollm2/config.py:sweep_peagle   # 6.
    python -m specjax.run --config=experiments/block_smollm2/config.py:specbench \
      --config.specbench.question_file=PATH/Spec-Bench/data/spec_bench/question.jsonl  # 7.
    python -m specjax.run --config=experiments/block_smollm2/config.py:specbench_float32 \
      --config.specbench.question_file=PATH/Spec-Bench/data/spec_bench/question.jsonl  # 7b.
    python -m specjax.run --config=experiments/block_smollm2/config.py:dspark         # 8.
    python -m specjax.run --config=experiments/block_smollm2/config.py:promote_dspark
    python -m specjax.run --config=experiments/block_smollm2/config.py:sweep_dspark
    python -m specjax.run --config=experiments/block_smollm2/config.py:block16        # 9.
    python -m specjax.run --config=experiments/block_smollm2/config.py:block16_requests
    python -m specjax.run --config=experiments/block_smollm2/config.py:sweep_blocks
    python -m specjax.run --config=experiments/block_smollm2/config.py:block4         # 10.
    python -m specjax.run --config=experiments/block_smollm2/config.py:block4_requests
    python -m specjax.run --config=experiments/block_smollm2/config.py:sweep_block4
    python -m specjax.report experiments/block_smollm2                                # README

1. DFlash (``objective.name = dflash``): one draft layer over SmolLM2's layers 2, 14 and 27
   (EAGLE-3's), blocks of 8 (the anchor and 7 drafted positions), 16 anchored blocks per row
   and step, position weight exp(-(d - 1) / 4), ``<empty_output>`` (id 16, never in chat
   text) at the masked positions, a draft vocabulary of the 8192 most frequent next tokens
   (EAGLE's size: the head's rows a block scores). EAGLE's 1.'s rows (greedy replies to chat
   and Python prompts plus the two corpora, 3000 rows of 256 tokens, 32 held out) and
   schedule: 1000 steps of 8 rows, learning rate 2e-3 after 20 warm-up steps, cosine to 10%.
   The target's features of every row are computed once (``data.feature_cache``, float16).
2. ``:requests`` continues it as EAGLE's ``:requests`` continued EAGLE's 1.: 300 steps on 768
   rows of replies to assistant requests and Python, learning rate 1e-3.
3. ``:sweep_requests`` decodes the held-out prompts (the four categories and the six new chat
   prompts) greedily with AR, DFlash as a 7-chain and as a 14-node tree (the chain and each
   depth's second candidate beside it; with and without the lookup branch), EAGLE
   ``:requests``' 16-node tree with the lookup branch, and prompt lookup, in one process.
4. ``step_cost.py`` times one DFlash step (its catch-up and the block forward) against an AR
   step at blocks of 4, 8 and 16, in float32 and bfloat16 (``results/step_cost.json``).
5. ``:peagle``: P-EAGLE (the published EAGLE-3 layer drafting 8 tokens in one forward) started
   from eagle_smollm2's ``:eagle3_serve`` (the published EAGLE-3 after EAGLE 1.'s 1000 steps)
   and trained 300 steps on ``:requests``' rows: the same 1000 + 300 step budget, the last 300
   on blocks (16 anchors per row, depth d weighted as COD sampling keeps it, kl).
   ``:promote_peagle`` commits it as ``drafter_peagle/``.
6. ``:sweep_peagle`` decodes it as an 8-chain, a 16-node tree (the chain and each depth's
   second candidate) and that tree with the lookup branch, beside the served EAGLE-3
   (``experiments/eagle_smollm2/drafter_eagle3``, its EAGLE-2 tree with the lookup branch) and
   prompt lookup, in one process.
7. ``:specbench``: Spec-Bench's 65-question subset (first turns, 256 new tokens, greedy) in
   bfloat16, this CPU's faster dtype: both block drafters as chains and as trees with the
   lookup branch, the served EAGLE-3 and prompt lookup, each beside one AR run per question.
   The question file is Spec-Bench's (github.com/hemingkx/Spec-Bench).
   ``:specbench_float32`` (7b.) decodes the first two questions of each category in float32
   with the two block trees and prompt lookup: every greedy answer is checked equal to AR's.
8. ``:dspark``: DSpark, 1.'s DFlash continued as 2. (300 steps on :requests' rows) with a
   rank-64 Markov head (W2 from zero) and the confidence head; ``:sweep_dspark`` decodes it
   beside 2.'s DFlash (chain, tree, tree with the lookup branch).
9. ``:block16`` then ``:block16_requests``: 1. and 2. at blocks of 16 (the same rows and
   steps); ``:sweep_blocks`` decodes it as a 15-chain beside 2.'s drafter as chains of 7 and
   3 (a block of 4's drafts), at temperatures 0 and 1.
10. ``:block4`` then ``:block4_requests``: 1. and 2. at blocks of 4 (the same rows, steps and
   position weight); ``:sweep_block4`` decodes it as a 3-chain beside 2.'s 3-chain (the same
   positions, trained in blocks of 8), at temperatures 0 and 1.
"""

from configs import demo, train_tiny
from configs import specbench as specbench_config
from experiments import held_out
from specjax.tasks import promote
from specjax.train import objectives

HERE = "experiments/block_smollm2"
RESULTS = f"{HERE}/results"
WORKDIR = "results/block_smollm2"  # checkpoints and drafters (not in git)
GREEDY_DATA = "data/self_distill/smollm2_greedy"  # configs/self_distill_smollm2.py:greedy
REQUESTS_DATA = "data/self_distill/smollm2_requests"  # configs/self_distill_smollm2.py:requests
EAGLE_REQUESTS = "experiments/eagle_smollm2/drafter_requests"  # EAGLE :requests, promoted
DRAFTER = f"{HERE}/drafter"  # 2.'s drafter, promoted (:promote): what the sweeps decode
EAGLE3_RUN = "eagle_smollm2:eagle3_serve"  # the published EAGLE-3 after EAGLE's 1.'s budget
EAGLE3_SERVED = "experiments/eagle_smollm2/drafter_eagle3"  # ... continued as :requests
PEAGLE_DRAFTER = f"{HERE}/drafter_peagle"  # 5.'s drafter, promoted (:promote_peagle)
PEAGLE_DEPTHS = 8  # P-EAGLE's tokens per forward
DSPARK_DRAFTER = f"{HERE}/drafter_dspark"  # 8.'s drafter, promoted (:promote_dspark)
DSPARK_RANK = 64  # the Markov head's W1 reads the 49,152-token vocabulary: 3.1 M weights
FEATURES = "data/features/block_smollm2"  # float16 features of the training rows, once
FEATURE_LAYERS = (2, 14, 27)  # low, middle, high of SmolLM2's 30 layers (EAGLE-3's)
MASK_ID = 16  # <empty_output>: never in chat replies
BLOCK = 8


def _training():
  """1.: DFlash on EAGLE's 1.'s rows and schedule."""
  c = demo.base()  # SmolLM2 target, held-out chat and code prompts, greedy, batch 1
  c.task = "train"
  c.workdir = WORKDIR
  c.record_to = f"{RESULTS}/train"
  t = train_tiny.get_config()
  for section in ("data", "train", "optim", "mesh", "distributed", "evaluate"):
    c[section] = t[section]
  c.drafter.name = "dflash"
  c.objective = objectives.default_config("dflash")
  c.objective.dflash.update(feature_layers=FEATURE_LAYERS, num_layers=1, block_size=BLOCK,
                            mask_id=MASK_ID, vocab_size=8192, anchors=16, gamma=4.0,
                            loss="kl")  # fmt: skip
  c.data.update(sources=(GREEDY_DATA, "chitchat", "python"), seq_len=256, max_examples=3000,
                eval_examples=32, seed=0, feature_cache=FEATURES)  # fmt: skip
  c.train.update(steps=1000, global_batch=8, log_every=10, eval_every=100, eval_batches=2,
                 checkpoint_every=50, keep=2)  # fmt: skip
  c.optim.update(learning_rate=2e-3, warmup_steps=20, decay_steps=980, weight_decay=0.0)
  return c


def _requests(c, name: str):
  """2.: 1.'s drafter, 300 more steps on replies to assistant requests and Python."""
  c.workdir, c.record_to = f"{WORKDIR}_{name}", f"{RESULTS}/{name}"
  c.objective.dflash.init_from = f"{WORKDIR}/draft_final"
  c.data.update(sources=(REQUESTS_DATA, "python"), max_examples=768,
                feature_cache=f"{FEATURES}_requests")  # fmt: skip
  c.train.steps = 300
  c.optim.update(learning_rate=1e-3, decay_steps=280)


def _peagle(c, name: str):
  """5.: P-EAGLE from the published EAGLE-3 after EAGLE's 1.'s budget (``EAGLE3_RUN``), 300
  steps on :requests' rows: the same 1000 + 300 steps, the last 300 drafting blocks of 8."""
  c.workdir, c.record_to = f"{WORKDIR}_{name}", f"{RESULTS}/{name}"
  c.drafter.name = "peagle"
  c.objective = objectives.default_config("peagle")
  c.objective.peagle.update(init_from=EAGLE3_RUN, num_depths=PEAGLE_DEPTHS, mask_id=MASK_ID,
                            anchors=16, loss="kl")  # fmt: skip
  c.data.update(sources=(REQUESTS_DATA, "python"), max_examples=768,
                feature_cache=f"{FEATURES}_requests")  # fmt: skip
  c.train.steps = 300
  c.optim.update(learning_rate=1e-3, decay_steps=280)


def _dspark(c, name: str):
  """8.: DSpark, 1.'s DFlash continued as :requests with a Markov head (rank 64, W2 from zero:
  it starts as 1.'s drafter) and the confidence head: the same 1000 + 300 steps."""
  _requests(c, name)
  c.objective.dflash.update(markov_rank=DSPARK_RANK, markov_head="vanilla", confidence=True)


BLOCK_SIZES = (16, 4)  # 9. and 10.: beside 1. and 2.'s 8


def _block_size(c, name: str):
  """9. and 10.: 1. (``:block16``, ``:block4``) and then 2. (``:block16_requests``, ...) at
  another block size, the same steps and rows; position weight gamma 7 at 16 (the paper's)."""
  b = int(name.removeprefix("block").removesuffix("_requests"))
  if name.endswith("_requests"):
    _requests(c, name)
    c.objective.dflash.init_from = f"{WORKDIR}_block{b}/draft_final"
  else:
    c.workdir, c.record_to = f"{WORKDIR}_{name}", f"{RESULTS}/{name}"
  c.objective.dflash.update(block_size=b, gamma=7.0 if b >= 16 else 4.0)


def blocks_sweep_variants() -> dict:
  """9.'s drafter as a chain over its block (15 drafted tokens) beside 2.'s as chains of 7
  and of 3 (what a block of 4 drafts; its positions were trained in blocks of 8), at
  temperatures 0 and 1 (``:sweep_blocks``)."""
  out = {
    "dflash_chain_3": dflash_variant(DRAFTER, tuple((0,) * d for d in range(1, 4))),
    "dflash_chain_7": dflash_variant(DRAFTER),
  }
  for b in (b for b in BLOCK_SIZES if b > BLOCK):
    out[f"dflash_b{b}_chain_{b - 1}"] = dflash_variant(f"{WORKDIR}_block{b}_requests/draft_final")
  return out


def block4_sweep_variants() -> dict:
  """10.'s drafter as a chain over its block of 4 beside 2.'s 3-chain (``:sweep_block4``)."""
  return {
    "dflash_chain_3": dflash_variant(DRAFTER, tuple((0,) * d for d in range(1, 4))),
    "dflash_b4_chain_3": dflash_variant(f"{WORKDIR}_block4_requests/draft_final"),
  }


# A static tree over the block's 7 depths: the top-1 chain, and at every depth the second
# candidate beside it (a block's depths do not depend on the tokens above, so a node's
# alternatives are its depth's next ranks: branching off the chain is all a tree can add).
CATERPILLAR = tuple((0,) * d for d in range(1, BLOCK)) + tuple(
  (0,) * (d - 1) + (1,) for d in range(1, BLOCK)
)


def dflash_variant(path: str, tree_paths: tuple = (), lookup: int = 0) -> dict:
  """A sweep variant decoding the DFlash drafter at ``path``: a chain over its block, or the
  tree ``tree_paths`` (paths of child ranks); ``lookup``: a lookup branch of that many tokens."""
  return {"name": "dflash", "dflash": {"path": path, "tree_paths": tuple(tree_paths),
                                       "lookup": lookup}}  # fmt: skip


def sweep_variants() -> dict:
  trained = DRAFTER
  eagle = {"path": EAGLE_REQUESTS, "top_k": 4, "depth": 6, "total": 16, "lookup": 4}
  return {
    "dflash_chain_7": dflash_variant(trained),
    "dflash_tree_14": dflash_variant(trained, CATERPILLAR),
    "dflash_tree_14_lookup4": dflash_variant(trained, CATERPILLAR, lookup=4),
    "eagle_req_16_l4": {"name": "eagle", "eagle": eagle},
    "lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
  }


def peagle_variant(path: str, tree_paths: tuple = (), lookup: int = 0) -> dict:
  """A sweep variant decoding the P-EAGLE drafter at ``path`` (as ``dflash_variant``)."""
  return {"name": "peagle", "peagle": {"path": path, "tree_paths": tuple(tree_paths),
                                       "lookup": lookup}}  # fmt: skip


# P-EAGLE's tree over its 8 depths: the chain and each depth's second candidate beside it.
CATERPILLAR_8 = tuple((0,) * d for d in range(1, PEAGLE_DEPTHS + 1)) + tuple(
  (0,) * (d - 1) + (1,) for d in range(1, PEAGLE_DEPTHS + 1)
)


def peagle_sweep_variants() -> dict:
  """5.'s P-EAGLE as a chain of 8, a 16-node tree, and that tree with the lookup branch,
  beside the EAGLE-3 it started from continued as :requests (``EAGLE3_SERVED``: its EAGLE-2
  tree with the lookup branch) and prompt lookup (EAGLE :requests' and DFlash's trees:
  ``:sweep_requests``, at temperature 0 their τ is the same in any process)."""
  eagle = {"top_k": 4, "depth": 6, "total": 16, "lookup": 4}
  return {
    "peagle_chain_8": peagle_variant(PEAGLE_DRAFTER),
    "peagle_tree_16": peagle_variant(PEAGLE_DRAFTER, CATERPILLAR_8),
    "peagle_tree_16_lookup4": peagle_variant(PEAGLE_DRAFTER, CATERPILLAR_8, lookup=4),
    "eagle3_16_l4": {"name": "eagle", "eagle": eagle | {"path": EAGLE3_SERVED}},
    "lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
  }


PROMOTIONS = {"promote": (f"{WORKDIR}_requests", DRAFTER),
              "promote_peagle": (f"{WORKDIR}_peagle", PEAGLE_DRAFTER),
              "promote_dspark": (f"{WORKDIR}_dspark", DSPARK_DRAFTER)}  # fmt: skip


def _promote(c, name: str):
  """2.'s drafter to ``DRAFTER`` (``:promote``), or 5.'s to ``PEAGLE_DRAFTER``
  (``:promote_peagle``), with its manifest (task=promote)."""
  c.task = "promote"
  c.promote = promote.default_config()
  run, to = PROMOTIONS[name]
  # P-EAGLE trains its own head (39 MB in float32): committed in bfloat16.
  c.promote.update(run=run, to=to, dtype="" if name == "promote" else "bfloat16")


def dspark_sweep_variants() -> dict:
  """8.'s DSpark as a 7-chain and as the 14-node tree with the lookup branch (a node's
  children drawn under its token), beside 2.'s DFlash the same ways (the same process)."""
  return {
    "dspark_chain_7": dflash_variant(DSPARK_DRAFTER),
    "dspark_tree_14": dflash_variant(DSPARK_DRAFTER, CATERPILLAR),
    "dspark_tree_14_lookup4": dflash_variant(DSPARK_DRAFTER, CATERPILLAR, lookup=4),
    "dflash_chain_7": dflash_variant(DRAFTER),
    "dflash_tree_14_lookup4": dflash_variant(DRAFTER, CATERPILLAR, lookup=4),
  }


SWEEPS = {"sweep_requests": sweep_variants, "sweep_peagle": peagle_sweep_variants,
          "sweep_dspark": dspark_sweep_variants, "sweep_blocks": blocks_sweep_variants,
          "sweep_block4": block4_sweep_variants}  # fmt: skip


def specbench_variants() -> dict:
  """7.'s methods: each block drafter as its chain and as its tree with the lookup branch, the
  served EAGLE-3's tree with the lookup branch, and prompt lookup."""
  dflash, peagle = sweep_variants(), peagle_sweep_variants()
  return {
    "dflash_chain_7": dflash["dflash_chain_7"],
    "dflash_tree_14_l4": dflash["dflash_tree_14_lookup4"],
    "peagle_chain_8": peagle["peagle_chain_8"],
    "peagle_tree_16_l4": peagle["peagle_tree_16_lookup4"],
    "eagle3_16_l4": peagle["eagle3_16_l4"],
    "lookup_k4": peagle["lookup_k4"],
  }


def _specbench():
  """7.: Spec-Bench's 65-question subset in bfloat16 (this CPU's faster dtype: an AR step
  0.72 of float32's, results/step_cost.json), every method beside one AR run."""
  c = specbench_config.get_config()
  c.output_dir = f"{RESULTS}/specbench_bf16"
  c.dtype = "bfloat16"
  c.specbench.variants = specbench_variants()
  return c


def _specbench_float32():
  """7b.: the block trees with the lookup branch and prompt lookup on the first 26 of those
  questions (two per category) in float32, the faster dtype for greedy speculative decoding
  on a CPU without AMX (one-row bfloat16 AR is faster there, but exact bfloat16 runs every
  forward at the drafter's rows): every greedy answer must equal AR's."""
  c = _specbench()
  c.output_dir = f"{RESULTS}/specbench_f32"
  c.dtype = "float32"
  c.specbench.per_category = 2  # 26 questions: the first two of each category
  v = specbench_variants()
  c.specbench.variants = {k: v[k] for k in ("dflash_tree_14_l4", "peagle_tree_16_l4", "lookup_k4")}
  return c


def _sweep(c, name: str):
  categories = {**held_out.CATEGORIES, "chat_new": held_out.CHAT_NEW}
  by_block = name in ("sweep_blocks", "sweep_block4")
  temperatures = (0.0, 1.0) if by_block else ()
  held_out.sweep_on(c, f"{RESULTS}/{name}", categories, SWEEPS[name](), temperatures=temperatures)
  if by_block:  # two timed passes per job (τ is the question here)
    c.benchmark.repeats = 2


VARIANTS = {
  "requests": _requests, "promote": _promote, "sweep_requests": _sweep, "peagle": _peagle,
  "promote_peagle": _promote, "sweep_peagle": _sweep, "dspark": _dspark,
  "promote_dspark": _promote, "sweep_dspark": _sweep, "sweep_blocks": _sweep,
  "sweep_block4": _sweep,
  **{f"block{b}{s}": _block_size for b in BLOCK_SIZES for s in ("", "_requests")},
}  # fmt: skip


def get_config(arg: str | None = None):
  if arg == "specbench":
    return _specbench()
  if arg == "specbench_float32":
    return _specbench_float32()
  c = _training()
  if not arg:
    return c
  if arg not in VARIANTS:
    raise ValueError(
      f"unknown variant {arg!r} of block_smollm2/config.py; choose "
      f"{', '.join(VARIANTS)}, specbench, specbench_float32."
    )
  VARIANTS[arg](c, arg)
  return c
