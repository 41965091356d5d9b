"""task=losslessness: rejection rate = TV(p, q), and sampled vs enumerated joint distributions.

Three measurements, written to ``output_dir/losslessness.json``:

* ``random_pairs``: for ``losslessness.pairs`` random (p, q) over a small vocabulary, one token
  drawn from q per row and verified against p by the chain rule (``verify.verify``) over
  ``losslessness.rows`` rows: the empirical rejection rate next to TV(p, q).
* ``real_logits``: the configured target and draft (a draft model) read the same corpus text
  teacher-forced (one batched forward each); at every position one token is drawn from the
  draft's q (temperature ``temperature``) and verified against the target's p: the rejection
  rate per TV bin next to the mean TV of the bin.
* ``joint``: a random tiny target (vocab 5) sampled through ``generate`` with a draft-model
  chain and with an EAGLE sampled tree, ``losslessness.samples`` rows each, three new tokens:
  the empirical frequency of every sequence next to its enumerated probability, and the
  chi-square p-value.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specjax import build, drafters, exact, results, sampling, verify
from specjax.decode import generate
from specjax.drafters import DraftModel, eagle
from specjax.drafters.base import Draft
from specjax.measure.machine import machine
from specjax.models import llama, tiny
from specjax.train import corpora


def random_pairs(num_pairs: int, rows: int, vocab: int, seed: int) -> list[dict]:
  rng = np.random.default_rng(seed)
  out = []
  for i in range(num_pairs):
    conc = rng.choice([0.1, 0.5, 2.0])  # peaked to flat pairs: TV across its range
    p, q = rng.dirichlet(np.ones(vocab) * conc), rng.dirichlet(np.ones(vocab) * conc)
    tokens = rng.choice(vocab, size=(rows, 1), p=q).astype(np.int32)
    q_all = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (rows, 1, vocab))
    draft = Draft(jnp.asarray(tokens), q_all)
    p_all = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (rows, 2, vocab))
    n, _ = verify.verify(jax.random.key(i), draft, p_all, None)
    rejected = float(np.mean(np.asarray(n) == 0))
    out.append({"tv": 0.5 * float(np.abs(p - q).sum()), "rejected": rejected})
  return out


def real_logits(config, target, drafter, dparams) -> dict:
  """Teacher-forced p and q on corpus text; one verified draw per position."""
  lc = config.losslessness
  docs = corpora.corpus_documents(lc.corpus)
  tok = target.tokenizer
  ids = []
  for doc in docs:
    ids += tok.encode(doc)
    if len(ids) >= lc.tokens:
      break
  seq = jnp.asarray([ids[: lc.tokens]], jnp.int32)
  sp = sampling.SamplingParams.create(config.temperature, config.top_k, config.top_p)
  logits_of = jax.jit(llama.logits_of, static_argnums=1)
  p = sampling.probs(logits_of(target.params, target.cfg, seq)[0][0], sp)  # [T, V]
  alone = drafters.FAMILIES[drafter.name].price.alone(drafter)  # the drafter as an LM
  q = sampling.probs(logits_of(dparams, alone, seq)[0][0], sp)
  tv = 0.5 * jnp.abs(p - q).sum(-1)
  draws = jax.random.categorical(jax.random.key(config.seed), jnp.log(q), axis=-1)
  draft = Draft(draws[:, None].astype(jnp.int32), q[:, None])
  n, _ = verify.verify(jax.random.key(config.seed + 1), draft, jnp.stack([p, p], 1), sp)
  rejected, tv = np.asarray(n) == 0, np.asarray(tv)
  edges = np.linspace(0, 1, lc.bins + 1)
  bins = []
  for lo, hi in zip(edges[:-1], edges[1:], strict=True):
    sel = (tv >= lo) & ((tv < hi) | (hi == 1))
    if sel.sum():
      bins.append(
        {"lo": float(lo), "hi": float(hi), "positions": int(sel.sum()),
         "mean_tv": float(tv[sel].mean()), "rejected": float(rejected[sel].mean())}
      )  # fmt: skip
  return {
    "corpus": lc.corpus,
    "positions": int(tv.size),
    "mean_tv": float(tv.mean()),
    "rejected": float(rejected.mean()),
    "bins": bins,
  }


def joint(samples: int, seed: int) -> dict:
  """Sampled vs enumerated 3-token continuations of a vocab-5 random target."""
  target = tiny.random_model(seed=7, vocab_size=5)
  dcfg, dparams = tiny.random_model(seed=8, vocab_size=5)
  ecfg = eagle.EagleConfig(target[0], ("final",), 0)  # a random EAGLE layer, full vocabulary
  eparams = eagle.init_params(ecfg, jax.random.key(seed), target[1], np.arange(5))
  cases = {
    "chain (draft model, K = 2)": (DraftModel(dcfg, 2), dparams),
    "tree (EAGLE, 2 x 2, 3 nodes)": (eagle.Eagle(ecfg, 2, 2, 3, sampled=True), eparams),
  }
  prompt, knobs = [1, 2, 3], dict(temperature=1.0)
  truth = exact.sequence_distribution(
    target[1], target[0], prompt, 3, sampling.SamplingParams.create(**knobs)
  )
  out = {}
  rows = JOINT_ROWS
  for name, (drafter, dp) in cases.items():
    counts: dict[tuple, int] = {}
    for call in range(samples // rows):
      got = generate(target[1], target[0], [prompt] * rows, drafter=drafter, drafter_params=dp,
                     max_new_tokens=3, max_len=10, seed=seed + call, **knobs)  # fmt: skip
      for row in got.tokens:
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    n = sum(counts.values())
    sampled = [list(k) for k in counts for _ in range(counts[k])]
    out[name] = {
      "samples": n,
      "pvalue": exact.chi2_pvalue(sampled, truth),
      "sequences": [
        {"seq": list(k), "exact": v, "empirical": counts.get(k, 0) / n}
        for k, v in sorted(truth.items(), key=lambda kv: -kv[1])
      ],
    }
  return out


JOINT_ROWS = 4000  # generate() rows per call of the joint-distribution check


def _check(lc: ml_collections.ConfigDict) -> None:
  """The section's sizes and corpus, before anything is computed."""
  for field, least in (("pairs", 1), ("rows", 1), ("vocab", 2), ("tokens", 2), ("bins", 1)):
    build.check_integer(lc[field], f"config.losslessness.{field}", least)
  s = lc.samples
  if isinstance(s, bool) or not isinstance(s, int) or s < JOINT_ROWS or s % JOINT_ROWS:
    raise ValueError(
      f"config.losslessness.samples must be a positive multiple of {JOINT_ROWS} (rows drawn per "
      f"call), got {s!r}."
    )
  try:
    corpora.corpus_path(lc.corpus)
  except ValueError as e:
    raise ValueError(f"config.losslessness.corpus: {e}") from None


def run(config: ml_collections.ConfigDict) -> dict:
  build.check(config)
  price = drafters.FAMILIES[config.drafter.name].price
  if price is None or price.alone is None:
    models = [n for n, f in drafters.FAMILIES.items() if f.price and f.price.alone]
    raise ValueError(
      f"config.drafter.name={config.drafter.name!r}: task=losslessness compares real logits of "
      f"two models; set drafter.name to a drafter that is a model ({', '.join(models)})."
    )
  lc = config.losslessness
  _check(lc)
  record = {"config": config.to_dict(), "machine": machine()}
  record["random_pairs"] = random_pairs(lc.pairs, lc.rows, lc.vocab, config.seed)
  target = build.target(config)
  drafter, dparams = build.drafter(config, target)
  record["real_logits"] = real_logits(config, target, drafter, dparams)
  record["joint"] = joint(lc.samples, config.seed)
  pairs = record["random_pairs"]
  gap = max(abs(r["tv"] - r["rejected"]) for r in pairs)
  print(f"random pairs: {len(pairs)}, largest |rejection - TV| {gap:.4f}")
  rl = record["real_logits"]
  print(
    f"real logits ({rl['positions']} positions of {rl['corpus']}): mean TV "
    f"{rl['mean_tv']:.4f}, rejected {rl['rejected']:.4f}"
  )
  for name, j in record["joint"].items():
    print(f"{name}: {j['samples']} samples, chi-square p = {j['pvalue']:.3f}")
  print(f"wrote {results.write_json(f'{config.output_dir}/losslessness.json', record)}")
  return record
