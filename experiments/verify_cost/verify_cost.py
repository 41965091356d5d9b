"""What a T-token verify costs against its matrices: SmolLM2-135M's forward at T = 1, 2, 4, 8, 16
next to the bare matrix products it must do, in float32 and bfloat16, in one process.

    bash scripts/install_models.sh smollm2
    python experiments/verify_cost/verify_cost.py                 # ~6 min on 2 CPU cores
    python -m specjax.report experiments/verify_cost              # README's results block

Every program is compiled first; then each round times every (program, T) once, interleaved
in a fresh random order, and a cell is the median over rounds (a slow spell of a shared machine
lands on every cell alike). Programs, all batch 1 over ``--context`` cached tokens (default 192):

- ``floor``: the matrix products alone: 30 layers of q, k, v, o, gate, up, down, then the
  [49152, 576] head, on weights stored [out, in] with float32 accumulation (bfloat16:
  activations rounded to bfloat16 before each product), the faster at each T of two forms:
  ``floor_rows`` (``einsum('ti,oi->to')``) and ``floor_transposed`` (``einsum('ti,io->to', x,
  w.T)``, a matrix-vector product for one row);
- ``forward`` / ``forward_tree``: ``llama.forward_kv`` as verification runs it (the cache read,
  not written), under a causal mask and under a tree (a star: every node a child of the root);
- the breakdown, each part alone over all 30 layers: ``norms_rope`` (two RMSNorms and RoPE
  per layer), ``attention`` (scores and values over the cached window and the new tokens),
  ``head`` (the LM head alone), ``cache_write`` (the T new keys and values written into the
  cache, as ``llama.write_kv`` commits an accepted step).

Writes ``results/verify_cost.json`` and ``results/verify_cost.png``.
"""

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax import trees
from specjax.models import llama, registry

HERE = Path(__file__).resolve().parent
SIZES = (1, 2, 4, 8, 16)
COLUMNS = ("floor", "floor_rows", "floor_transposed", "forward", "forward_tree", "norms_rope",
           "attention", "head", "cache_write")  # fmt: skip


def product(x_TxI, w_OxI, transposed: bool = False):
  """The floor's matrix product: activations in the weight's type, float32 accumulation; the
  row form ``einsum('ti,oi->to')``, or the transposed form ``einsum('ti,io->to', x, w.T)``."""
  x_TxI = x_TxI.astype(w_OxI.dtype)
  if transposed:
    return jnp.einsum("ti,io->to", x_TxI, w_OxI.T, preferred_element_type=jnp.float32)
  return jnp.einsum("ti,oi->to", x_TxI, w_OxI, preferred_element_type=jnp.float32)


def programs(cfg, params, context: int, num_slots: int):
  """``{name: (jitted fn, args_for(T))}``: every program timed, at any T."""
  layers = params["layers"]
  head_VxD = params["embed"] if cfg.tie_embeddings else params["lm_head"]
  dtype = llama.param_dtype(params)
  cache = llama.init_cache(cfg, 1, num_slots, dtype)
  cache = cache.replace(lengths=jnp.asarray([context], jnp.int32))
  positions = lambda t: (context + jnp.arange(t))[None]  # noqa: E731
  tokens = lambda t: jnp.ones((1, t), jnp.int32)  # noqa: E731
  star = lambda t: trees.ancestors(jnp.zeros((1, t - 1), jnp.int32))  # noqa: E731
  x = lambda t: jax.random.normal(jax.random.key(t), (1, t, cfg.dim), jnp.float32)  # noqa: E731

  def chain(transposed):
    prod = lambda x, w: product(x, w, transposed)  # noqa: E731

    @jax.jit
    def floor(layers, head_VxD, x_1xTxD):
      h, kv = x_1xTxD[0], 0.0
      for p in layers:
        q, k, v = (prod(h, p[w]) for w in ("wq", "wk", "wv"))
        kv = kv + jnp.sum(k) + jnp.sum(v)  # kept, so XLA does not drop the k and v products
        h = h + prod(q, p["wo"])
        h = h + prod(prod(h, p["w_gate"]) * prod(h, p["w_up"]), p["w_down"])
      return prod(h, head_VxD), kv

    return floor

  @jax.jit
  def forward(params, cache, tokens_1xT, positions_1xT, mask):
    logits, _, _ = llama.forward_kv(params, cfg, tokens_1xT, positions_1xT, cache, mask)
    return logits

  @jax.jit
  def norms_rope(layers, x_1xTxD, positions_1xT):
    """Per layer: both RMSNorms, and RoPE over the normed stream cut into heads (the size of
    the queries when ``dim == num_heads * head_dim``, as in SmolLM2 and Qwen2.5)."""
    h, t = x_1xTxD, x_1xTxD.shape[1]
    for p in layers:
      a = llama.rms_norm(h, p["attn_norm"], cfg.norm_eps)
      q = llama.rope(a.reshape(1, t, -1, cfg.head_dim), positions_1xT, cfg.rope_theta)
      h = h + llama.rms_norm(q.reshape(1, t, -1), p["mlp_norm"], cfg.norm_eps)
    return h

  @jax.jit
  def attention(cache, q_x, k_new, v_new, mask):
    attn = llama.attention_inputs(cache.lengths, mask, cache.num_slots, write=False)
    out = 0.0
    for k_i, v_i in zip(cache.k, cache.v, strict=True):
      branches = [
        lambda *a, w=w: llama._attend_window(cfg, w, *a) for w in attn.windows
      ]  # fmt: skip
      out = out + jax.lax.switch(
        attn.window, branches, q_x, k_i, v_i, k_new, v_new, attn.lengths, attn.mask
      )
    return out

  @jax.jit
  def head(head_VxD, x_1xTxD):
    return llama.head({"embed": head_VxD, "lm_head": head_VxD}, cfg, x_1xTxD)

  def qkv_like(t):
    """Queries (float32, as projections return them) and new keys/values (the cache's type)."""
    g, hd = cfg.num_kv_heads, cfg.head_dim
    q = jax.random.normal(jax.random.key(1), (1, g, cfg.groups * t, hd), jnp.float32)
    kv = jax.random.normal(jax.random.key(2), (1, g, t, hd), dtype)
    return q, kv, kv

  @jax.jit
  def cache_write(cache, k_new, v_new):
    new = llama.NewKV((k_new,) * cfg.num_layers, (v_new,) * cfg.num_layers)
    return llama.write_kv(cache, new).k[-1]

  causal = llama.causal_mask
  return {
    "floor_rows": (chain(False), lambda t: (layers, head_VxD, x(t))),
    "floor_transposed": (chain(True), lambda t: (layers, head_VxD, x(t))),
    "forward": (forward, lambda t: (params, cache, tokens(t), positions(t), causal(t))),
    "forward_tree": (
      forward,
      lambda t: (params, cache, tokens(t), positions(t), star(t) if t > 1 else causal(t)),
    ),
    "norms_rope": (norms_rope, lambda t: (layers, x(t), positions(t))),
    "attention": (attention, lambda t: (cache, *qkv_like(t), causal(t))),
    "head": (head, lambda t: (head_VxD, x(t))),
    "cache_write": (cache_write, lambda t: (cache, *qkv_like(t)[1:])),
  }


def measure(progs: dict, sizes, rounds: int) -> dict:
  """``{name: {T: median seconds}}``, interleaved over rounds after one compile each."""
  jobs = {(name, t): (fn, make(t)) for name, (fn, make) in progs.items() for t in sizes}
  for (name, t), (fn, args) in jobs.items():
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    print(f"compiled {name} T={t} ({time.perf_counter() - t0:.1f} s)", flush=True)
  times = {job: [] for job in jobs}
  order = list(jobs)
  for r in range(rounds):
    random.Random(r).shuffle(order)  # no program always runs after the same one
    for job in order:
      fn, args = jobs[job]
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[job].append(time.perf_counter() - t0)
    print(f"round {r + 1}/{rounds}", flush=True)
  out = {}
  for (name, t), ts in times.items():
    out.setdefault(name, {})[t] = statistics.median(ts)
  return out


def cpu_model() -> str:
  """The CPU's model name and its vector extensions that bfloat16 products depend on."""
  try:
    info = Path("/proc/cpuinfo").read_text()
  except OSError:
    return platform.processor() or platform.machine()
  name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if "model name" in ln), "")
  flags = next(
    (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
  )
  wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
  return f"{name} ({' '.join(f for f in wanted if f in flags)})"


def write_json(path: Path, record: dict) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
  with os.fdopen(fd, "w") as f:
    json.dump(record, f, indent=1)
  os.replace(tmp, path)


def plot(record: dict, path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  style = {"float32": "-", "bfloat16": "--"}
  for dtype, cells in record["ms"].items():
    for name, color in (("floor", "0.5"), ("forward", "C0"), ("forward_tree", "C1")):
      ts = sorted(int(t) for t in cells[name])
      ax.plot(ts, [cells[name][str(t)] for t in ts], style[dtype], color=color, marker="o",
              label=f"{name} ({dtype})")  # fmt: skip
  ar = record["ms"]["float32"]["forward"]["1"]
  ax.axhline(ar, color="k", lw=0.8, ls=":", label="float32 AR step (T = 1)")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("tokens verified in one forward (T)")
  ax.set_ylabel("ms (median of interleaved rounds)")
  ax.set_title(f"{record['model']}: verify cost against its matrices")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default="smollm2-135m-instruct")
  ap.add_argument("--context", type=int, default=192)
  ap.add_argument("--rounds", type=int, default=9)
  ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
  ap.add_argument("--out", default=str(HERE / "results"))
  args = ap.parse_args()
  if args.rounds < 1 or args.context < 1 or min(args.sizes) < 1:
    ap.error("--rounds, --context and every --sizes value must be >= 1")
  cfg, params32, _ = registry.load(args.model)
  num_slots = args.context + max(args.sizes) + 1
  ms = {}
  for dtype in ("float32", "bfloat16"):
    params = params32 if dtype == "float32" else llama.cast(params32, jnp.bfloat16)
    secs = measure(programs(cfg, params, args.context, num_slots), args.sizes, args.rounds)
    ms[dtype] = {name: {str(t): s * 1e3 for t, s in by_t.items()} for name, by_t in secs.items()}
    ms[dtype]["floor"] = {  # the floor: whichever form of the products is faster at that T
      t: min(ms[dtype]["floor_rows"][t], ms[dtype]["floor_transposed"][t])
      for t in ms[dtype]["floor_rows"]
    }
    del params
  record = {
    "model": args.model,
    "context": args.context,
    "rounds": args.rounds,
    "machine": {
      "cpu": cpu_model(),
      "cores": os.cpu_count(),
      "jax": jax.__version__,
      "backend": jax.default_backend(),
    },  # fmt: skip
    "ms": ms,
  }
  out = Path(args.out)
  write_json(out / "verify_cost.json", record)
  plot(record, out / "verify_cost.png")
  print(report_table(record))
  print(f"wrote {out / 'verify_cost.json'} and {out / 'verify_cost.png'}")


def report_table(record: dict) -> str:
  """Rows per (dtype, T): every program's ms and the forward over its floor."""
  from specjax import results

  rows = []
  for dtype, cells in record["ms"].items():
    for t in sorted(int(t) for t in cells["floor"]):
      row = {"dtype": dtype, "T": t} | {n: round(cells[n][str(t)], 2) for n in COLUMNS}
      row["forward_vs_floor"] = round(cells["forward"][str(t)] / cells["floor"][str(t)], 2)
      rows.append(row)
  return results.markdown_table(rows, tuple(rows[0]))


if __name__ == "__main__":
  main()
