"""Your own data files: the three formats, assistant-only masks against the chat template,
bad records, streaming (order, shards, memory, resume), self-distillation from your prompts."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import train_worker
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from specjax.models import registry
from specjax.models.tokenizer import Tokenizer
from specjax.train import conversations as cv
from specjax.train import data, files

ROOT = Path(__file__).resolve().parents[1]
# SmolLM2's template with a shorter default system prompt.
TEMPLATE = (
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
  "{{ '<|im_start|>system\nYou are a test.<|im_end|>\n' }}{% endif %}"
  "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_chat_tokenizer() -> Tokenizer:
  """Byte-level ids (256) plus <|endoftext|>, <|im_start|>, <|im_end|>, and a jinja chat
  template: a real specjax Tokenizer that loads in milliseconds (vocabulary 259)."""
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  hf = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  hf.decoder = decoders.ByteLevel()
  specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
  hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
  return Tokenizer(
    hf, eos_id=hf.token_to_id("<|im_end|>"), chat_template=TEMPLATE, fingerprint="bytes"
  )


@pytest.fixture(scope="module")
def tok():
  return byte_chat_tokenizer()


def conversation(i: int, turns: int = 2, system: bool = False) -> list[dict]:
  msgs = [{"role": "system", "content": f"sys {i}"}] if system else []
  for t in range(turns):
    msgs.append({"role": "user", "content": f"question {i}.{t} " * (1 + (i + t) % 3)})
    msgs.append({"role": "assistant", "content": f"reply {i}.{t} " * (1 + (i * t) % 4)})
  return msgs


def sharegpt(msgs):
  back = {"user": "human", "assistant": "gpt", "system": "system"}
  return {"conversations": [{"from": back[m["role"]], "value": m["content"]} for m in msgs]}


def write_jsonl(path: Path, records, bad: dict[int, str] | None = None) -> Path:
  """Records one per line; ``bad``: line number (1-based) -> raw text put there instead."""
  lines = [json.dumps(r) for r in records]
  for lineno, raw in sorted((bad or {}).items()):
    lines.insert(lineno - 1, raw)
  path.write_text("".join(line + "\n" for line in lines))
  return path


def files_config(path, **kw) -> dict:
  return {"files": [str(path)], "format": "sharegpt", "seq_len": 64} | kw


# -- formats ---------------------------------------------------------------------------------------


def test_each_format_parses_to_messages_or_text(tmp_path):
  msgs = conversation(1, system=True)
  share = write_jsonl(tmp_path / "s.jsonl", [sharegpt(msgs)] * 2)
  (tmp_path / "s.json").write_text(json.dumps([sharegpt(msgs), sharegpt(msgs)], indent=2))
  parts = [
    {**m, "content": [{"type": "text", "text": m["content"][:3]}, {"type": "text", "text": m[
      "content"][3:]}]} for m in msgs
  ]  # fmt: skip
  oai = write_jsonl(tmp_path / "m.jsonl", [{"messages": msgs}, {"messages": parts}])
  text = write_jsonl(tmp_path / "t.jsonl", [{"text": "one document"}, {"text": "another é"}])
  for path, fmt, want in [
    (share, "sharegpt", [msgs, msgs]),
    (tmp_path / "s.json", "sharegpt", [msgs, msgs]),
    (oai, "messages", [msgs, msgs]),
    (text, "text", ["one document", "another é"]),
  ]:
    index = cv.scan([path], fmt)
    reader = cv.Reader(index, fmt)
    assert [reader[i] for i in range(len(reader))] == want, path
  starts = [
    i + 1 for i, x in enumerate((tmp_path / "s.json").read_text().splitlines()) if x == "  {"
  ]
  assert cv.scan([tmp_path / "s.json"], "sharegpt").line.tolist() == starts


def test_globs_expand_sorted_and_a_trailing_user_turn_is_dropped(tmp_path):
  for name in ("b", "a"):
    write_jsonl(tmp_path / f"{name}.jsonl", [{"messages": conversation(0) + [{"role": "user",
                "content": "more?"}]}])  # fmt: skip
  assert [p.name for p in cv.expand([str(tmp_path / "*.jsonl")])] == ["a.jsonl", "b.jsonl"]
  index = cv.scan(cv.expand([str(tmp_path / "*.jsonl")]), "messages")
  assert cv.Reader(index, "messages")[0] == conversation(0)


# -- masks ----------------------------------------------------------------------------------------


def _check_mask_against_template(tokenizer, msgs):
  """Every assistant turn's tokens, and nothing else, are targets; the tokens before turn k
  are exactly the prompt the template gives the model for it, token for token."""
  tokens, target = cv.render(msgs, tokenizer)
  template = tokenizer.apply_chat_template
  assert tokenizer.decode(tokens) == template(msgs, add_generation_prompt=False)
  want = np.zeros(len(tokens), bool)
  for k, m in enumerate(msgs):
    if m["role"] != "assistant":
      continue
    prompt = tokenizer.encode(template(msgs[:k], add_generation_prompt=True))
    through = tokenizer.encode(template(msgs[: k + 1], add_generation_prompt=False))
    assert tokens[: len(prompt)].tolist() == prompt
    assert tokens[: len(through)].tolist() == through
    want[len(prompt) : len(through)] = True
    assert tokenizer.decode(tokens[len(prompt) : len(through)]).startswith(m["content"])
  np.testing.assert_array_equal(target, want)


@pytest.mark.parametrize("system", [False, True])
def test_assistant_only_mask_is_exact_against_the_chat_template(tok, system):
  for i in range(6):
    _check_mask_against_template(tok, conversation(i, turns=1 + i % 3, system=system))


@pytest.mark.real_model
def test_assistant_only_mask_with_smollm2s_tokenizer():
  smol = Tokenizer.from_gguf(registry.resolve("smollm2-135m-instruct"))
  for i in range(6):
    _check_mask_against_template(smol, conversation(i, turns=1 + i % 3, system=i % 2 == 0))
  msgs = [
    {"role": "user", "content": "Écris  un poème\n\n sur la mer 🌊"},
    {"role": "assistant", "content": " Voici :\n  la mer\tbleue...  "},
  ]
  _check_mask_against_template(smol, msgs)


def test_packed_rows_mask_the_next_token_of_assistant_tokens(tok, tmp_path):
  records = [sharegpt(conversation(i)) for i in range(40)]
  path = write_jsonl(tmp_path / "c.jsonl", records)
  train, _ = files.load_files(files_config(path, seq_len=256), tok)
  b = train.batch(0, 8)
  sep = data.separator_id(tok)
  for tokens, mask in zip(b["tokens"], b["mask"], strict=True):
    assert mask[-1] == 0
    text = tok.decode(tokens[1:][mask[:-1] > 0])  # the learned next tokens
    assert "question" not in text and "system" not in text and "reply" in text
    ends = np.flatnonzero(tokens == sep)
    assert ends.size and (mask[ends] == 0).all()  # nothing is learned past a conversation


def test_long_records_split_or_truncate(tok, tmp_path):
  long = sharegpt([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a" * 200}])
  path = write_jsonl(tmp_path / "l.jsonl", [long] * 4)
  split, _ = files.load_files(files_config(path, long="split"), tok)
  trunc, _ = files.load_files(files_config(path, long="truncate"), tok)
  rows_split = split.batch(0, 16)
  rows_trunc = trunc.batch(0, 4)
  # ~240 tokens: split into 4 rows of 64 (the last partly filled), truncated into 1.
  learned = lambda rows: int(rows["mask"].sum())
  assert learned(trunc.batch(0, 4)) < learned(split.batch(0, 16)) // 3
  assert (rows_trunc["tokens"][:, 0] == rows_trunc["tokens"][0, 0]).all()
  assert rows_split["tokens"].shape == (16, 64)


# -- bad input ------------------------------------------------------------------------------------


def test_stop_names_the_file_and_line_and_skip_counts(tok, tmp_path):
  records = [sharegpt(conversation(i)) for i in range(10)]
  path = write_jsonl(
    tmp_path / "c.jsonl", records, bad={3: "{not json", 7: '{"conversations": []}'}
  )
  with pytest.raises(ValueError, match=rf"{path}:3: not JSON.*on_error='skip'"):
    files.check_files(files_config(path))
  index = files.check_files(files_config(path, on_error="skip"))
  assert len(index) == 10 and index.problems == 2
  assert [p.split(": ")[0] for p in index.first_problems] == [f"{path}:3", f"{path}:7"]
  assert "skipped 2 bad record(s)" in index.report()


@pytest.mark.parametrize(
  "write, cfg, message",
  [
    (lambda p: p.write_text("nothing\n\n"), {"on_error": "skip"}, "nothing usable"),
    (lambda p: write_jsonl(p, [{"text": "x"}]), {}, r"\.jsonl:1: no 'conversations' list"),
    (lambda p: None, {"files": ["/nonexistent/*.jsonl"]}, "config.data.files.*matches no file"),
    (lambda p: None, {"format": "alpaca"}, "config.data.format='alpaca'.*sharegpt"),
    (lambda p: None, {"long": "wrap"}, "config.data.long='wrap'"),
    (lambda p: None, {"on_error": "ignore"}, "config.data.on_error='ignore'"),
    (lambda p: None, {"sources": ["kjv"]}, "both sources and files"),
  ],
  ids=["nothing-usable", "wrong-format", "missing", "format", "long", "on_error", "sources"],
)
def test_bad_configs_and_files_are_one_clear_error(tmp_path, write, cfg, message):
  path = tmp_path / "c.jsonl"
  write_jsonl(path, [sharegpt(conversation(0))])
  write(path)
  with pytest.raises(ValueError, match=message):
    files.check_files(files_config(path) | cfg)


def test_a_template_that_renders_nothing_is_refused_before_loading(tmp_path):
  class NoPrefix:  # a template whose prompt is not a prefix of the rendered conversation
    eos_id = 0

    def encode(self, text):
      return list(text.encode())

    def apply_chat_template(self, messages, add_generation_prompt=True):
      return ("GEN " if add_generation_prompt else "") + "|".join(m["content"] for m in messages)

  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(0))])
  with pytest.raises(ValueError, match="renders none of the first 1 record.*prefix by prefix"):
    files.check_files(files_config(path), NoPrefix())


# -- streaming ------------------------------------------------------------------------------------


def _ids(tok, batch) -> list[str]:
  """Which conversations a batch holds (their 'question i.' markers), row by row."""
  out = []
  for row in batch["tokens"]:
    text = tok.decode(row)
    out.append(sorted({w.split(".")[0] for w in text.split("question ")[1:]}))
  return out


def test_order_is_deterministic_for_a_seed_and_each_epoch_differs(tok, tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(i, turns=1)) for i in range(24)])
  cfg = files_config(path, seq_len=128)
  a, _ = files.load_files(cfg, tok)
  b, _ = files.load_files(cfg, tok)
  run = lambda ds, seed: [ds.batch(s, 4, seed=seed)["tokens"] for s in range(12)]
  first, again, other = run(a, 0), run(b, 0), run(b, 1)
  assert all((x == y).all() for x, y in zip(first, again, strict=True))
  assert any((x != y).any() for x, y in zip(first, other, strict=True))
  seen = [c for s in range(12) for row in _ids(tok, {"tokens": first[s]}) for c in row]
  epoch = sorted(seen[:24], key=int)
  assert epoch == [str(i) for i in range(24)]  # every record once per epoch, then again
  assert seen[:24] != seen[24:48]


def test_each_process_reads_only_its_shard(tok, tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(i, turns=1)) for i in range(21)])
  shards = [cv.scan([path], "sharegpt", process_index=p, process_count=2) for p in (0, 1)]
  assert [s.records for s in shards] == [11, 10]
  lines = [set(s.line.tolist()) for s in shards]
  assert not lines[0] & lines[1] and lines[0] | lines[1] == set(range(1, 22))
  ds, _ = files.load_files(files_config(path, seq_len=128), tok, process_index=1, process_count=2)
  got = {c for s in range(6) for row in _ids(tok, ds.batch(s, 4, process_index=1,
         process_count=2)) for c in row}  # fmt: skip
  assert got == {str(i) for i in range(1, 21, 2)}
  with pytest.raises(ValueError, match="process 1 of 2, asked for process 0"):
    ds.batch(0, 4, process_index=0, process_count=2)


def test_eval_rows_are_held_out_records(tok, tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(i, turns=1)) for i in range(30)])
  train, ev = files.load_files(files_config(path, seq_len=128, eval_examples=3), tok)
  assert len(ev) == 3 and ev.tokens.shape == (3, 128)
  held = {c for row in _ids(tok, {"tokens": ev.tokens}) for c in row}
  seen = {c for s in range(10) for row in _ids(tok, train.batch(s, 4)) for c in row}
  assert held and not held & seen and len(held | seen) == 30
  with pytest.raises(ValueError, match="eval_examples=50.*leave none to train"):
    files.load_files(files_config(path, seq_len=128, eval_examples=50), tok)


def test_resume_at_a_step_gives_the_same_rows(tok, tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(i)) for i in range(50)])
  cfg = files_config(path, seq_len=80)
  straight, _ = files.load_files(cfg, tok, state_dir=tmp_path / "w")
  want = [straight.batch(s, 4, seed=3) for s in range(25)]
  for state_dir, skipped in ((tmp_path / "w", 4 * 3), (None, 4 * 23)):
    resumed, _ = files.load_files(cfg, tok, state_dir=state_dir)
    for s in (23, 24):
      got = resumed.batch(s, 4, seed=3)
      np.testing.assert_array_equal(got["tokens"], want[s]["tokens"])
      np.testing.assert_array_equal(got["mask"], want[s]["mask"])
    assert resumed.skipped_rows == skipped  # from the position saved at step 20, or from 0
  head = straight.head(8, seed=3)
  np.testing.assert_array_equal(head.tokens, np.concatenate([want[0]["tokens"], want[1]["tokens"]]))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_large_file_is_streamed_in_little_memory():
  """10 MB here (scripts/data_files_memory.py --mb 200 --steps 5 is the measured number in
  docs/data.md): scanning it and reading rows grows the process by a few MB, not the file."""
  proc = subprocess.run(
    [sys.executable, str(ROOT / "scripts" / "data_files_memory.py"), "--mb", "10", "--steps", "0"],
    capture_output=True,
    text=True,
    env=train_worker.env(),
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = train_worker.parse(proc.stdout)
  assert out["file_mb"] >= 10 and out["scan"]["records"] == out["records"]
  assert out["growth_mb"] < 40, out


# -- self-distillation from your prompts ---------------------------------------------------------


def test_self_distill_from_your_prompts_writes_shards_that_train(tok, tmp_path):
  from specjax.models import tiny
  from specjax.train import distill, distill_prompts

  records = [{"messages": conversation(i, turns=2)} for i in range(5)]
  path = write_jsonl(tmp_path / "p.jsonl", records, bad={2: "{oops"})
  with pytest.raises(ValueError, match=r"p\.jsonl:2: not JSON"):
    distill_prompts.file_prompts([str(path)], tok, fmt="messages")
  first = distill_prompts.file_prompts([str(path)], tok, fmt="messages", on_error="skip")
  every = distill_prompts.file_prompts(
    [str(path)], tok, fmt="messages", turns="all", on_error="skip"
  )
  assert len(first.ids) == 5 and len(every.ids) == 10
  assert first.texts[0] == tok.apply_chat_template(conversation(0)[:1])
  assert every.texts[1] == tok.apply_chat_template(conversation(0)[:3])  # with the file's reply
  short = distill_prompts.file_prompts([str(path)], tok, fmt="messages", turns="all",
                                       max_tokens=70, on_error="skip")  # fmt: skip
  assert short.skipped > 0 and all(len(p) <= 70 for p in short.ids)

  cfg, params = tiny.random_model(seed=0, vocab_size=tok.vocab_size, dim=32, num_layers=2)
  out = tmp_path / "shards"
  kw = dict(max_new_tokens=6, max_len=160, batch_size=4, shard_size=4, progress=False)
  manifest = distill.self_distill(params, cfg, first.ids, out, sources=first.sources, **kw)
  assert manifest["num_examples"] == 5 and len(manifest["shards"]) == 2
  (out / "manifest.json").unlink()  # as if killed before the end
  again = distill.self_distill(params, cfg, first.ids, out, sources=first.sources, **kw)
  assert again["stats"]["new_tokens_this_run"] == 0  # a rerun resumes: its shards are done
  ds = data.load_dataset([str(out)], None, seq_len=160, max_examples=None)
  assert len(ds) == 5 and ds.mask.sum() == 5 * 6


def test_self_distill_task_checks_prompts_from_before_loading(tmp_path):
  from configs import self_distill_smollm2
  from specjax.tasks import self_distill

  c = self_distill_smollm2.get_config()
  path = write_jsonl(tmp_path / "p.jsonl", [{"text": "hello"}])
  c.distill.sources, c.distill.prompts_from = (), (str(path),)
  with pytest.raises(ValueError, match=r"p\.jsonl:1: no 'conversations' list"):
    self_distill.check(c)
  c.distill.format = "text"
  self_distill.check(c)
  c.distill.turns = "last"
  with pytest.raises(ValueError, match="config.distill.turns='last'"):
    self_distill.check(c)
  c.distill.turns, c.distill.sources = "first", ("kjv",)
  with pytest.raises(ValueError, match="set config.distill.sources=()"):
    self_distill.check(c)


# -- kill -9 during a data-file training run -------------------------------------------------------

_WORKER = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[2])
import jax, numpy as np
from specjax import parallel
from specjax.models import tiny
from specjax.train import files, loop, objectives
from test_data_files import byte_chat_tokenizer
import train_worker

args = json.loads(sys.argv[1])
tok = byte_chat_tokenizer()
cfg = {"files": [args["file"]], "format": "sharegpt", "seq_len": 48, "on_error": "skip"}
train, _ = files.load_files(cfg, tok, state_dir=args["workdir"], process_index=0, process_count=1)
ds = train_worker.SlowDataset(train, args["slow_s"]) if args.get("slow_s") else train
tcfg, tparams = tiny.random_model(seed=0, vocab_size=259, dim=32, num_layers=2)
dcfg = tiny.tiny_config(vocab_size=259, dim=32, num_layers=1, name="draft")
objective = objectives.DraftDistill(tcfg, dcfg, embed="copy")
lcfg = loop.LoopConfig(steps=args["steps"], global_batch=4, workdir=args["workdir"], log_every=1,
                       checkpoint_every=5, progress=False)
mesh = parallel.make_mesh(parallel.MeshConfig())
result = loop.train(objective, tparams, ds, None, lcfg, train_worker.OPTIM, mesh)
leaves = jax.tree.leaves(jax.device_get(result.state.params))
digest = hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in leaves)).hexdigest()
print("RESULT " + json.dumps({"start": result.start_step, "digest": digest,
                              "skipped_rows": train.skipped_rows}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_kill_9_during_a_file_training_run_resumes_to_the_same_weights(tmp_path):
  from specjax.train import metrics_log

  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(i, turns=1)) for i in range(60)])
  args = {"file": str(path), "steps": 30}

  def command(workdir, **kw):
    return [sys.executable, "-c", _WORKER, json.dumps(args | {"workdir": str(workdir)} | kw),
            str(ROOT / "tests")]  # fmt: skip

  def finish(workdir):
    proc = subprocess.run(
      command(workdir), capture_output=True, text=True, env=train_worker.env(), timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return train_worker.parse(proc.stdout)

  straight = finish(tmp_path / "a")
  metrics = tmp_path / "b" / "metrics.jsonl"
  proc = subprocess.Popen(
    command(tmp_path / "b", slow_s=0.1),
    env=train_worker.env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 180
  while len(metrics_log.read(metrics)) < 13 and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  os.kill(proc.pid, signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  killed_at = len(metrics_log.read(metrics))
  assert 13 <= killed_at < 30
  resumed = finish(tmp_path / "b")
  assert 0 < resumed["start"] <= killed_at
  assert resumed["skipped_rows"] < 4 * files.STATE_EVERY  # from a saved stream position
  assert resumed["digest"] == straight["digest"]  # bit for bit
