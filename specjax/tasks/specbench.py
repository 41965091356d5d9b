"""task=specbench: Spec-Bench's questions, autoregressive and with the drafter, per category.

    python -m specjax.run --config=configs/specbench.py \
      --config.specbench.question_file=PATH/Spec-Bench/data/spec_bench/question.jsonl

Spec-Bench (github.com/hemingkx/Spec-Bench, ``data/spec_bench/question.jsonl``; nothing of it
ships here) holds 480 questions in 13 categories: MT-bench's 80 (eight categories, two turns
each) and 80 each of translation, summarization, qa, math_reasoning and rag. Each line has
``question_id``, ``category`` and ``turns`` (a list of strings).

Every question is decoded batch 1, in the target's chat template, once autoregressively and
once with each drafter, in this process, one after the other: ``config.drafter``, or each of
``specbench.variants`` (name -> ``drafter`` overrides, as ``sweep.variants``: several drafters
share one AR run and one answer file each). First turns only
(``specbench.turns = 1``, the default) or every turn (``2``: the second is asked after the
method's own first answer, as Spec-Bench does). ``specbench.categories`` and
``specbench.per_category`` (the first N of each) take a subset. At temperature 0 every turn's
tokens must equal AR's, or the run stops with an error. A prompt width a method has not
decoded before is compiled by a one-token call first, so every timed call runs warm.

Writes under ``output_dir``: ``model_answer/<model_id>.jsonl`` per method in Spec-Bench's own
answer layout (its ``evaluation/speed.py`` reads them unchanged), appended after every
question: a rerun skips the questions both files hold (``specbench.resume``); then
``specbench.json`` (per category, per Spec-Bench column and overall: mean accepted tokens τ,
tokens/s and speedup, computed from the answer files as speed.py computes them:
``specbench_report.py``) and ``specbench.md`` (the table in Spec-Bench's leaderboard layout).
See docs/specbench.md.
"""

import dataclasses
import functools
import hashlib
import json
import time
import uuid
from pathlib import Path

import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict
from tqdm.auto import tqdm

from specjax import build, decode, loop, results
from specjax.decode import generate
from specjax.drafters import artifact
from specjax.measure import sweep
from specjax.measure.machine import machine
from specjax.models import llama, source
from specjax.tasks import specbench_report
from specjax.tasks.specbench_report import AR

FIELDS = ("question_id", "category", "turns")


def default_config() -> ml_collections.ConfigDict:
  """The ``specbench`` config section's defaults."""
  c = ml_collections.ConfigDict()
  c.question_file = ""  # Spec-Bench's data/spec_bench/question.jsonl (hemingkx/Spec-Bench)
  c.turns = 1  # 1: first turns only; 2: second turns too, after the method's own first answer
  c.categories = ()  # categories to run; () = every category in the file
  c.per_category = config_dict.placeholder(int)  # the first N of each category; None = all
  c.resume = True  # skip the questions the answer files hold; False: start afresh
  c.variants = {}  # name -> config.drafter overrides (as sweep.variants); {} = config.drafter
  return c


def variants(config: ml_collections.ConfigDict) -> dict:
  """The drafters to run beside AR: name -> config (``specbench.variants``, or the config's
  own drafter under its name)."""
  given = dict(config.specbench.get("variants") or {})
  if not given:
    return {config.drafter.name: config}
  if AR in given:
    raise ValueError(
      f"config.specbench.variants names a variant {AR!r}, Spec-Bench's name for the "
      "autoregressive answers: call it something else."
    )
  return {name: sweep.variant_config(config, dict(o)) for name, o in given.items()}


def read_questions(path: str) -> list[dict]:
  """The questions of a Spec-Bench ``question.jsonl``, every line checked."""
  field = "config.specbench.question_file"
  if not path:
    raise ValueError(
      f"{field} is empty: point it at Spec-Bench's data/spec_bench/question.jsonl (from "
      "github.com/hemingkx/Spec-Bench; specjax ships no questions)."
    )
  if Path(path).is_dir():
    hint = " (it holds one)" if (Path(path) / "question.jsonl").is_file() else ""
    raise ValueError(f"{field}={path!r} is a directory: name the question.jsonl file itself{hint}.")
  if not Path(path).is_file():
    raise ValueError(
      f"{field}={path!r} does not exist: download Spec-Bench's data/spec_bench/question.jsonl "
      "(github.com/hemingkx/Spec-Bench) and give its path."
    )
  out, seen = [], set()
  for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
    if not line.strip():
      continue
    where = f"{field}={path!r}, line {i}"
    try:
      q = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{where} is not JSON ({e.msg}): fix or remove the line.") from None
    missing = [k for k in FIELDS if not isinstance(q, dict) or k not in q]
    if missing:
      raise ValueError(
        f"{where} has no {', '.join(map(repr, missing))}: every line needs question_id, "
        "category and turns (a list of strings), as Spec-Bench's question.jsonl has."
      )
    turns = q["turns"]
    if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t for t in turns)):
      raise ValueError(f"{where}: 'turns' must be a non-empty list of non-empty strings.")
    if isinstance(q["question_id"], bool) or not isinstance(q["question_id"], (int, str)):
      raise ValueError(f"{where}: 'question_id' must be a number or a string.")
    if q["question_id"] in seen:
      raise ValueError(f"{where} repeats question_id {q['question_id']!r}: ids must be unique.")
    seen.add(q["question_id"])
    out.append(q)
  if not out:
    raise ValueError(f"{field}={path!r} holds no questions.")
  return out


def select(config: ml_collections.ConfigDict, questions: list[dict]) -> list[dict]:
  """The questions ``specbench.categories`` and ``specbench.per_category`` ask for."""
  s = config.specbench
  known = list(dict.fromkeys(q["category"] for q in questions))
  wanted = (s.categories,) if isinstance(s.categories, str) else tuple(s.categories)
  unknown = [c for c in wanted if c not in known]
  if unknown:
    raise ValueError(
      f"config.specbench.categories has {', '.join(map(repr, unknown))}, which "
      f"{s.question_file} lacks; its categories are {', '.join(known)}."
    )
  n = s.per_category
  if n is not None and not (isinstance(n, int) and n >= 1):
    raise ValueError(
      f"config.specbench.per_category={n!r} must be an integer >= 1 (the first N questions of "
      "each category), or None for all of them."
    )
  out, taken = [], {}
  for q in questions:
    c = q["category"]
    if (not wanted or c in wanted) and (n is None or taken.get(c, 0) < n):
      taken[c] = taken.get(c, 0) + 1
      out.append(q)
  return out


def check(config: ml_collections.ConfigDict) -> list[dict]:
  """Every field checked and the questions read, before any model loads; returns the
  questions to run."""
  if "specbench" not in config:
    raise ValueError(
      "task=specbench needs a config.specbench section: c.specbench = "
      "specjax.tasks.specbench.default_config() (see configs/specbench.py)."
    )
  s = config.specbench
  if s.turns not in (1, 2):
    raise ValueError(
      f"config.specbench.turns={s.turns!r} must be 1 (first turns) or 2 (both turns)."
    )
  if config.batch_size != 1:
    raise ValueError(
      f"task=specbench decodes one question at a time, as Spec-Bench does: set "
      f"config.batch_size = 1 (got {config.batch_size})."
    )
  if not (isinstance(config.max_new_tokens, int) and config.max_new_tokens >= 1):
    raise ValueError(f"config.max_new_tokens must be >= 1, got {config.max_new_tokens!r}.")
  questions = select(config, read_questions(s.question_file))
  for c in variants(config).values():
    build.check(c)
  encoder = Encoder(source.peek(config.target), source.header_config(config.target).vocab_size)
  longest = max(questions, key=lambda q: len(encoder.prompt(q["turns"][:1], [])))
  encoder.check_fits(longest, encoder.prompt(longest["turns"][:1], []), config)
  return questions


class Encoder:
  """Turns of a conversation -> prompt ids: the target's chat template, or (a random model,
  which has no tokenizer) each turn's UTF-8 bytes modulo the vocabulary, answers as ids."""

  def __init__(self, model, vocab_size: int):
    self.tokenizer = None if model is None else model.tokenizer
    self.vocab_size = vocab_size

  def prompt(self, turns: list[str], answers: list[list[int]]) -> list[int]:
    """``turns`` asked so far, each after the previous one's answer (``answers``: new ids)."""
    if self.tokenizer is None:
      ids = []
      for j, turn in enumerate(turns):
        ids += [b % self.vocab_size for b in turn.encode("utf-8")]
        ids += answers[j] if j < len(answers) else []
      return ids
    messages = []
    for j, turn in enumerate(turns):
      messages.append({"role": "user", "content": turn})
      if j < len(answers):
        messages.append({"role": "assistant", "content": self.text(answers[j])})
    return self.tokenizer.encode(self.tokenizer.apply_chat_template(messages))

  def text(self, ids: list[int]) -> str:
    """An answer as Spec-Bench writes it: cut at the first stop token, special tokens dropped,
    stripped (a random model's: its ids)."""
    if self.tokenizer is None:
      return " ".join(map(str, ids))
    stops = self.tokenizer.stop_ids
    end = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    return self.tokenizer.decode(ids[:end], skip_special_tokens=True).strip()

  @staticmethod
  def check_fits(question: dict, prompt: list[int], config) -> None:
    if len(prompt) + config.max_new_tokens > config.max_len:
      raise ValueError(
        f"question {question['question_id']} ({question['category']}) is {len(prompt)} prompt "
        f"tokens + max_new_tokens {config.max_new_tokens} > max_len {config.max_len}: raise "
        f"config.max_len to at least {len(prompt) + config.max_new_tokens} (or lower "
        "config.max_new_tokens, or leave the question out)."
      )


def accept_lengths(counts: dict) -> list[int]:
  """Tokens each target forward of a batch-1 run emitted, as Spec-Bench's ``accept_lengths``:
  1 for the prefill, n + 1 for a step that accepted n draft tokens. The loop counts steps per
  n (its histogram), so they come grouped by n, not in step order; the largest are trimmed
  where a budget or stop token cut a step short. They number the target forwards and sum to
  the tokens generated, so their mean is τ."""
  out = [1] + [n + 1 for n, k in enumerate(counts["accept_hist"]) for _ in range(int(k))]
  excess = sum(out) - int(counts["tokens"].sum())
  for i in reversed(range(len(out))):
    cut = min(excess, out[i] - 1)
    out[i], excess = out[i] - cut, excess - cut
  return out


def _timed(fn, prompt: list[int], warmed: set):
  """``(fn's Generation for [prompt], seconds)``, timed warm, as Spec-Bench warms up before it
  times. A prompt width ``warmed`` (this method's widths so far) lacks is compiled first by a
  one-token call (the budget is traced, so it is the same program); a timed call that still
  traced is run again and only the second run is timed."""
  width = decode.prompt_width(len(prompt), fn.keywords["max_len"])
  if width not in warmed:
    fn([prompt], max_new_tokens=1)
    warmed.add(width)
  for _ in range(2):
    traces = loop.TRACES["generate"]
    t0 = time.perf_counter()
    out = fn([prompt])
    seconds = time.perf_counter() - t0
    if loop.TRACES["generate"] == traces:
      break
  return out, seconds


def answer(
  question: dict, fn, encoder: Encoder, config, model_id: str, warmed: set
) -> tuple[dict, list]:
  """One method's answer to every turn asked of ``question``, as a Spec-Bench answer line,
  and the new ids of each turn (``warmed``: the prompt widths ``fn`` has compiled)."""
  turns = question["turns"][: config.specbench.turns]
  ids, choice = [], {"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [],
                     "wall_time": [], "accept_lengths": []}  # fmt: skip
  for j in range(len(turns)):
    prompt = encoder.prompt(turns[: j + 1], ids)
    encoder.check_fits(question, prompt, config)
    out, seconds = _timed(fn, prompt, warmed)
    ids.append(out.tokens[0])
    lengths = accept_lengths(out.counts)
    choice["turns"].append(encoder.text(out.tokens[0]))
    choice["decoding_steps"].append(len(lengths))
    choice["new_tokens"].append(len(out.tokens[0]))
    choice["wall_time"].append(seconds)
    choice["accept_lengths"] += lengths
  line = {"question_id": question["question_id"], "category": question["category"],
          "answer_id": uuid.uuid4().hex, "model_id": model_id, "choices": [choice],
          "tstamp": time.time()}  # fmt: skip
  return line, ids


def _read_answers(path: Path) -> dict:
  """question_id -> answer line, of an answer file (none: empty); a last line cut short by a
  kill is left out (its question is answered again)."""
  if not path.is_file():
    return {}
  out = {}
  lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
  for i, ln in enumerate(lines):
    try:
      a = json.loads(ln)
    except json.JSONDecodeError:
      if i == len(lines) - 1:
        break
      raise ValueError(f"{path}, line {i + 1} is not JSON: fix it or remove the file.") from None
    out[a["question_id"]] = a
  return out


def _write_answers(path: Path, answers: list[dict]) -> None:
  results.write_text(path, "".join(json.dumps(a) + "\n" for a in answers))


def _append(path: Path, line: dict) -> None:
  with path.open("a", encoding="utf-8") as f:
    f.write(json.dumps(line) + "\n")


def run(config: ml_collections.ConfigDict) -> dict:
  questions = check(config)
  out_dir = Path(config.output_dir)
  record_path = out_dir / "specbench.json"
  name = source.header_config(config.target).name
  methods = {
    m: f"{name}-{m}-{build.dtype(config)}-temp-{float(config.temperature):.1f}"
    for m in (AR, *variants(config))
  }
  files = {m: out_dir / "model_answer" / f"{model_id}.jsonl" for m, model_id in methods.items()}
  done, then = _resumed(config, record_path, files, questions)
  rows_then = then.get("forward_rows", {}) if done else {}
  # What each answered question asked (question_id as JSON -> digest): a resume over other
  # questions under the same ids is refused.
  digests = {k: v for k, v in then.get("question_digests", {}).items() if json.loads(k) in done}
  asked = {json.dumps(q["question_id"]): digest(q, config) for q in questions}
  record = {
    "config": config.to_dict(),
    "machine": machine(),
    "dtype": build.dtype_choice(config),
    "target": name,
    "question_file": config.specbench.question_file,
    "question_digests": digests | asked,
    "methods": {m: {"model_id": methods[m], "answer_file": str(files[m])} for m in methods},
    "forward_rows": rows_then,
  }  # fmt: skip  (each drafter's forward rows; 0: its own)
  results.write_json(record_path, record)  # the config the answer files are made with
  pending = [q for q in questions if q["question_id"] not in done]
  if pending:
    rows = _decode(config, pending, methods, files, len(questions))
    moved = {m: (rows_then[m], r) for m, r in rows.items() if rows_then.get(m, r) != r}
    if moved:  # e.g. total = auto chose another budget: each answer was checked at its own
      print(f"note: forward rows (then, now) changed on resuming: {moved}")
      rows = {m: [rows_then[m], r] if m in moved else r for m, r in rows.items()}
    record["forward_rows"] = rows
  answers = {m: _read_answers(files[m]) for m in methods}
  record |= specbench_report.summarize(questions, answers)
  differences = _read_differences(out_dir / DIFFERENCES, questions)
  record["greedy_outputs_identical"] = not differences if config.temperature == 0 else None
  if differences:
    record["greedy_differences"] = differences
  table = specbench_report.markdown(record, config)
  if differences:
    table += (
      f"\n\n{len(differences)} greedy answer(s) leave AR's in {build.dtype(config)} (rounding, "
      f"not the verifier: each with its logit gap in {DIFFERENCES})."
    )
  print(table)
  results.write_text(out_dir / "specbench.md", table + "\n")
  print(f"wrote {results.write_json(record_path, record)} and {out_dir / 'specbench.md'}")
  return record


def _read_differences(path: Path, questions: list[dict]) -> list[dict]:
  """The recorded greedy differences of ``questions``, a resumed run's earlier ones too (an
  answer made again replaces its earlier line)."""
  asked = {q["question_id"] for q in questions}
  if not path.is_file():
    return []
  lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
  latest = {(d["question_id"], d["method"]): d for d in lines if d["question_id"] in asked}
  return list(latest.values())


def digest(question: dict, config) -> str:
  """What a question's answers depend on: its category and the turns asked of it."""
  asked = {"category": question["category"], "turns": question["turns"][: config.specbench.turns]}
  return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:16]


def _resumed(config, record_path: Path, files: dict, questions: list[dict]) -> tuple[set, dict]:
  """The question ids every answer file holds already (``specbench.resume``), and the record
  they were made with; each file is cut to those, so an answer written just before an
  interrupt is made again with its pair. An earlier run of another config, or of other
  questions under the same ids, is an error, raised before any model loads."""
  if not config.specbench.resume:
    for f in (*files.values(), Path(config.output_dir) / DIFFERENCES):
      f.unlink(missing_ok=True)
    return set(), {}
  answers = {m: _read_answers(f) for m, f in files.items()}
  if not any(answers.values()):
    return set(), {}
  fix = "set config.specbench.resume=False to start afresh (or config.output_dir elsewhere)"
  differ, then = [], {}
  if record_path.is_file():
    then = artifact.read_json(record_path, "config.specbench.resume", fix)
    differ = sweep.differing_fields(then, config)
    was = then.get("config", {}).get("specbench", {})
    now = json.loads(json.dumps(config.specbench.to_dict(), default=str))
    differ += [f"specbench.{k}" for k in ("turns", "variants") if was.get(k) != now.get(k)]
  if differ or not record_path.is_file():
    what = f"other config.{', config.'.join(differ)}" if differ else "no specbench.json beside"
    raise ValueError(
      f"config.specbench.resume: the answers in {files[AR].parent} were made with {what}: {fix}."
    )
  both = set.intersection(*(set(a) for a in answers.values()))
  was = then.get("question_digests", {})  # question_id as JSON -> digest
  other = [  # a record of before the digests: the answers' categories at least
    q["question_id"] for q in questions if q["question_id"] in both
    and (was.get(json.dumps(q["question_id"]), digest(q, config)) != digest(q, config)
         or answers[AR][q["question_id"]]["category"] != q["category"])
  ]  # fmt: skip
  if other:
    raise ValueError(
      f"config.specbench.resume: the answers in {files[AR].parent} were made for other "
      f"questions ({', '.join(map(str, other))}) than config.specbench.question_file="
      f"{config.specbench.question_file!r} holds under those ids (their turns or category "
      f"differ): {fix}."
    )
  for m, f in files.items():
    _write_answers(f, [a for qid, a in answers[m].items() if qid in both])
  return both & {q["question_id"] for q in questions}, then


def _decode(config, pending: list[dict], methods: dict, files: dict, total: int) -> dict:
  """Decodes ``pending`` with AR and every drafter, appending each question's answers; returns
  each drafter's forward rows."""
  target = build.target(config)
  stop = None
  if target.tokenizer is not None and config.stop_at_eos:
    stop = tuple(sorted(target.tokenizer.stop_ids))
  kw = {"max_new_tokens": config.max_new_tokens, "max_len": config.max_len,
        "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p,
        "seed": config.seed, "eos_id": stop}  # fmt: skip
  fns, rows = {}, {}
  for name, c in variants(config).items():
    drafter, dparams = build.drafter(c, target)
    mesh, tparams, dparams = build.placed(c, target, drafter, dparams)
    target = dataclasses.replace(target, params=tparams)  # placed once: the others reuse it
    rows[name] = build.forward_rows(c, drafter)  # auto: bfloat16 greedy's exact rows
    fns[name] = functools.partial(generate, tparams, target.cfg, drafter=drafter,
                                  drafter_params=dparams, verifier=build.verifier(c), mesh=mesh,
                                  forward_rows=rows[name], **kw)  # fmt: skip
  ar = functools.partial(generate, target.params, target.cfg, mesh=mesh, **kw)
  fns = {AR: functools.partial(ar, forward_rows=0)} | fns
  # AR at a drafter's forward rows, where it has some: what its greedy answers must equal.
  references = {r: functools.partial(ar, forward_rows=r) for r in set(rows.values()) if r}
  encoder = Encoder(target, target.cfg.vocab_size)
  files[AR].parent.mkdir(parents=True, exist_ok=True)
  bar = tqdm(pending, desc="specbench", unit="question", initial=total - len(pending), total=total)
  steps, tokens = {m: 0 for m in fns if m != AR}, {m: 0 for m in fns if m != AR}  # running τ
  warmed = {m: set() for m in [*fns, *references]}
  for q in bar:
    lines, ids = {}, {}
    for r, fn in references.items():
      ids[r] = answer(q, fn, encoder, config, f"{AR}-{r}-rows", warmed[r])[1]
    for m, fn in fns.items():
      lines[m], ids[m] = answer(q, fn, encoder, config, methods[m], warmed[m])
      if m == AR or config.temperature != 0:
        continue
      ref = ids[rows[m]] if rows[m] else ids[AR]
      if rows[m] or build.dtype(config) == "float32":  # exact: a greedy difference is a bug
        _check_equal(q, ref, ids[m], m)
      elif found := difference(q, ref, ids[m], m, encoder, target):
        tqdm.write(_describe(found))
        _append(Path(config.output_dir) / DIFFERENCES, found)
    for m in methods:
      _append(files[m], lines[m])
    for m in steps:
      lengths = lines[m]["choices"][0]["accept_lengths"]
      steps[m], tokens[m] = steps[m] + len(lengths), tokens[m] + sum(lengths)
    bar.set_postfix({f"tau[{m}]": f"{tokens[m] / steps[m]:.2f}" for m in steps}, refresh=False)
  return rows


DIFFERENCES = "greedy_differences.jsonl"  # beside specbench.json: one line per differing answer


def difference(question, ar: list, spec: list, name: str, encoder, target) -> dict | None:
  """Where ``name``'s greedy answer first leaves AR's (None: it does not): the turn, the new
  token, both tokens and the target's logit gap between them there (AR's context, the run's
  dtype), which for a rounding difference is a near-tie."""
  for j, (a, s) in enumerate(zip(ar, spec, strict=True)):
    if a == s:
      continue
    at = next(
      (i for i, (x, y) in enumerate(zip(a, s, strict=False)) if x != y), min(len(a), len(s))
    )
    mine, theirs = (a[at] if at < len(a) else None), (s[at] if at < len(s) else None)
    gap = None
    if mine is not None and theirs is not None:
      context = encoder.prompt(question["turns"][: j + 1], ar[:j]) + list(a[:at])
      logits = llama.logits_of(target.params, target.cfg, jnp.asarray([context]))[0][0, -1]
      gap = float(logits[mine] - logits[theirs])
    return {"question_id": question["question_id"], "method": name, "turn": j + 1,
            "new_token": at, "ar_token": mine, "token": theirs, "logit_gap": gap}  # fmt: skip
  return None


def _describe(d: dict) -> str:
  gap = "" if d["logit_gap"] is None else f", logit gap {d['logit_gap']:.4f} at AR's context"
  return (
    f"note: question {d['question_id']}, turn {d['turn']}: {d['method']}'s greedy tokens leave "
    f"AR's at new token {d['new_token']} ({d['ar_token']} vs {d['token']}{gap}); recorded in "
    f"{DIFFERENCES}, the run goes on"
  )


def _check_equal(question: dict, ar: list, spec: list, name: str) -> None:
  for j, (a, s) in enumerate(zip(ar, spec, strict=True)):
    if a != s:
      at = next((i for i, (x, y) in enumerate(zip(a, s, strict=False)) if x != y), len(a))
      raise RuntimeError(
        f"question {question['question_id']}, turn {j + 1}: {name}'s greedy tokens differ from "
        f"AR's at new token {at} (lossless decoding must reproduce them): a bug, please report."
      )
