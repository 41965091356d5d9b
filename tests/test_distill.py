"""Self-distillation: shards hold exactly what generate produces, and read back as a Dataset."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import self_distill_smollm2, train_tiny
from experiments import held_out
from specjax.decode import generate
from specjax.models import llama, registry, tiny
from specjax.models.tokenizer import Tokenizer
from specjax.tasks import self_distill as task
from specjax.tasks import train as train_task
from specjax.train import corpora, data, distill, distill_prompts

KW = dict(max_new_tokens=6, max_len=24, batch_size=3, shard_size=6, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def model():
  return tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=2)


@pytest.fixture(scope="module")
def prompts():
  rng = np.random.default_rng(0)
  return [rng.integers(1, 64, size=rng.integers(2, 12)).tolist() for _ in range(8)]


@pytest.fixture(scope="module")
def distilled(model, prompts, tmp_path_factory):
  cfg, params = model
  out = tmp_path_factory.mktemp("distilled")
  labels = ["a", "b"] * 4
  manifest = distill.self_distill(params, cfg, prompts, out, sources=labels, progress=False, **KW)
  return out, manifest


def test_shards_hold_exactly_what_generate_produces(model, prompts, distilled):
  cfg, params = model
  out, manifest = distilled
  assert [s["examples"] for s in manifest["shards"]] == [6, 2]
  assert manifest["num_examples"] == 8 and manifest["sources"] == ["a", "b"]
  assert manifest["target"] == {"name": cfg.name, "vocab_size": 64, "tokenizer_fingerprint": None}
  _, arrays = data.read_shards(out)
  # The same batches (the last filled by repeating its prompts) and seeds, called directly.
  expected = []
  for start in range(0, 8, 3):
    batch = prompts[start : start + 3]
    padded = batch + batch[: 3 - len(batch)]
    kw = {k: KW[k] for k in ("max_new_tokens", "max_len", "temperature")}
    expected += generate(params, cfg, padded, seed=7 + start // 3, **kw).tokens[: len(batch)]
  for r, (p, c) in enumerate(zip(prompts, expected, strict=True)):
    n = len(p) + len(c)
    assert arrays["tokens"][r, :n].tolist() == p + c
    assert not arrays["tokens"][r, n:].any()
    assert arrays["lengths"][r] == n and arrays["prompt_lengths"][r] == len(p)
    # The loss counts exactly where the next token is a generated one.
    np.testing.assert_array_equal(np.flatnonzero(arrays["mask"][r]), np.arange(len(p) - 1, n - 1))
  assert arrays["source"].tolist() == [0, 1] * 4


def test_load_dataset_reads_a_shard_directory(distilled):
  out, _ = distilled
  _, arrays = data.read_shards(out)
  ds = data.load_dataset([str(out)], None, seq_len=10, max_examples=None)
  # Rows from the first token; a row cut at seq_len loses its last target.
  keep = [r for r in range(8) if arrays["prompt_lengths"][r] < 10]
  assert len(ds) == len(keep)
  np.testing.assert_array_equal(ds.tokens, arrays["tokens"][keep, :10])
  expected = arrays["mask"][keep, :10].copy()
  expected[:, -1] = 0
  np.testing.assert_array_equal(ds.mask, expected)
  wide = data.load_dataset([str(out)], None, seq_len=30, max_examples=5)
  assert wide.tokens.shape == (5, 30) and not wide.tokens[:, 24:].any()


def test_unfinished_directory_is_rejected_then_resumed(model, prompts, distilled, tmp_path):
  cfg, params = model
  src, _ = distilled
  for f in src.iterdir():
    (tmp_path / f.name).write_bytes(f.read_bytes())
  (tmp_path / data.MANIFEST).unlink()
  (tmp_path / "shard-00001.npz").unlink()  # An interrupted run: one shard done, no manifest.
  with pytest.raises(ValueError, match="no manifest.json"):
    data.load_dataset([str(tmp_path)], None, seq_len=8, max_examples=None)
  with pytest.raises(ValueError, match="other prompts than"):
    distill.self_distill(params, cfg, prompts[:7], tmp_path, progress=False, **KW)
  labels = ["a", "b"] * 4
  # The same prompts from bfloat16 weights (dtype = auto on another CPU): another target's rows.
  bf16 = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)
  with pytest.raises(ValueError, match=r"other settings \(dtype\)"):
    distill.self_distill(bf16, cfg, prompts, tmp_path, sources=labels, progress=False, **KW)
  manifest = distill.self_distill(
    params, cfg, prompts, tmp_path, sources=labels, progress=False, **KW
  )
  assert manifest["stats"]["shards_resumed"] == 1
  for name in ("shard-00000.npz", "shard-00001.npz"):
    with np.load(src / name) as a, np.load(tmp_path / name) as b:
      assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
  with pytest.raises(ValueError, match="already holds a finished"):
    distill.self_distill(params, cfg, prompts, tmp_path, sources=labels, progress=False, **KW)


def test_damaged_shard_is_named_and_generated_again(model, prompts, distilled, tmp_path):
  """A finished shard cut short (then no manifest: the run was interrupted): the resume names
  it, generates it again, and the directory equals an uninterrupted run's. A damaged shard in
  a finished directory is one error naming the file."""
  cfg, params = model
  src, _ = distilled
  for f in src.iterdir():
    (tmp_path / f.name).write_bytes(f.read_bytes())
  (tmp_path / data.MANIFEST).unlink()
  shard = tmp_path / "shard-00000.npz"
  shard.write_bytes(shard.read_bytes()[:300])
  labels = ["a", "b"] * 4
  manifest = distill.self_distill(
    params, cfg, prompts, tmp_path, sources=labels, progress=False, **KW
  )
  assert manifest["stats"]["shards_resumed"] == 1  # the undamaged one
  for name in ("shard-00000.npz", "shard-00001.npz"):
    with np.load(src / name) as a, np.load(tmp_path / name) as b:
      assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
  shard.write_bytes(shard.read_bytes()[:300])
  with pytest.raises(ValueError, match="shard-00000.npz is damaged"):
    data.load_dataset([str(tmp_path)], None, seq_len=8, max_examples=None)


def test_hidden_states_are_the_targets(model, prompts, tmp_path):
  cfg, params = model
  kw = KW | {"temperature": 0.0}
  distill.self_distill(
    params,
    cfg,
    prompts[:3],
    tmp_path,
    capture_layers=(0,),
    capture_final=True,
    progress=False,
    **kw,
  )
  _, arrays = data.read_shards(tmp_path)
  tokens = arrays["tokens"]
  s = tokens.shape[1]
  _, (final, layer0) = llama.logits_of(params, cfg, jnp.asarray(tokens), ("final", 0))
  valid = np.arange(s)[None, :] < arrays["lengths"][:, None]
  assert arrays["hidden_final"].dtype == np.float16
  assert arrays["hidden_final"].shape == (3, s, cfg.dim)
  assert arrays["hidden_layers"].shape == (3, 1, s, cfg.dim)
  for got, want in (
    (arrays["hidden_final"], final),
    (arrays["hidden_layers"][:, 0], layer0),
  ):
    np.testing.assert_allclose(got[valid], np.asarray(want)[valid], rtol=1e-2, atol=1e-2)
    assert not got[~valid].any()


@pytest.mark.slow
def test_corpus_prompts_are_deterministic_and_mixed():
  tok = Tokenizer.from_gguf(registry.resolve("smollm2-135m-instruct"))
  make = lambda seed: distill_prompts.corpus_prompts(
    corpora.CORPORA, tok, num_prompts=12, min_tokens=16, max_tokens=24, seed=seed
  )
  a, b, c = make(0), make(0), make(1)
  assert a == b and a.ids != c.ids
  assert a.sources == list(corpora.CORPORA) * 3
  for ids, text, source in zip(a.ids, a.texts, a.sources, strict=True):
    assert ids == tok.encode(text)
    assert text.endswith("<|im_start|>assistant\n")
    if source != "chitchat":
      wrapper = distill_prompts.INSTRUCTIONS[source].split("{")[0]
      body = text.split(wrapper, 1)[1].split("<|im_end|>")[0]
      assert 16 <= len(tok.encode(body)) <= 24 + 1  # +1: decode/encode may split a token.
  raw = distill_prompts.corpus_prompts(
    ["kjv"], tok, num_prompts=3, min_tokens=8, max_tokens=8, chat=False
  )
  assert all(len(ids) == 8 for ids in raw.ids) and "<|im_start|>" not in "".join(raw.texts)


@pytest.mark.slow
def test_task_prompts_ask_for_answers_and_never_repeat_the_held_out_prompts():
  tok = Tokenizer.from_gguf(registry.resolve("smollm2-135m-instruct"))
  make = lambda seed: distill_prompts.corpus_prompts(
    corpora.CORPORA, tok, num_prompts=48, min_tokens=16, max_tokens=24, seed=seed, tasks=True
  )
  a, b = make(0), make(0)
  assert a == b and a.sources == list(corpora.CORPORA) * 12
  used = set()
  for text, source in zip(a.texts, a.sources, strict=True):
    user = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
    if source == "chitchat":  # one whole question, not a conversation
      assert text.count("<|im_start|>user") == 1 and text.endswith("<|im_start|>assistant\n")
      assert user.endswith("?") and len(user.split()) >= 4
      continue
    wrappers = [w for w in distill_prompts.TASKS[source] if user.startswith(w.split("{")[0])]
    wrappers = [w for w in wrappers if user.endswith(w.split("}")[-1])]
    assert wrappers, user
    used.add(wrappers[0])
  assert len(used) >= 8  # several tasks per corpus, not one wrapper
  # The prompts that measure the drafters (experiments/held_out.json) stay out of training.
  prompts = [p for ps in held_out.CATEGORIES.values() for p in ps]
  assert not any(h[:40] in t for h in prompts for t in a.texts)
  with pytest.raises(ValueError, match="tasks=True .* chat=True"):
    distill_prompts.corpus_prompts(["kjv"], tok, num_prompts=1, min_tokens=8, max_tokens=8,
                                   chat=False, tasks=True)  # fmt: skip


@pytest.mark.parametrize("name", sorted(distill_prompts.REQUEST_SETS))
def test_request_prompts_are_distinct_templated_and_never_the_held_out_chat_prompts(name):
  tok = Tokenizer.from_gguf(registry.resolve("smollm2-135m-instruct"))
  a, b = (
    distill_prompts.request_prompts(tok, num_prompts=512, seed=0, name=name) for _ in range(2)
  )
  assert (
    a == b
    and a.texts != distill_prompts.request_prompts(tok, num_prompts=512, seed=1, name=name).texts
  )
  assert a.sources == ["requests"] * 512 and len(set(a.texts)) == 512
  every = distill_prompts.all_requests(name)
  users = []
  for ids, text in zip(a.ids, a.texts, strict=True):
    assert ids == tok.encode(text) and text.endswith("<|im_start|>assistant\n")
    assert text.count("<|im_start|>user") == 1
    users.append(text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0])
  assert set(users) <= every
  assert len({u.split()[0] for u in users}) >= 8  # many kinds of request, not one template
  # No request the templates can make is a prompt that measures the drafters.
  prompts = [*(p for ps in held_out.CATEGORIES.values() for p in ps), *held_out.CHAT_NEW]
  assert not {h.lower() for h in prompts} & {r.lower() for r in every}
  # The sets are disjoint: data made from one is new text next to data made from another.
  for other in set(distill_prompts.REQUEST_SETS) - {name}:
    assert not every & distill_prompts.all_requests(other)
  with pytest.raises(ValueError, match=f"make {len(every)} distinct requests"):
    distill_prompts.request_prompts(tok, num_prompts=len(every) + 1, name=name)
  # All of them: the loop ends.
  distill_prompts.request_prompts(tok, num_prompts=len(every), name=name)


# sha256 of the JSON list of the 512 prompt texts of seed 0, recorded when the "broad" set was
# added, after checking that these prompts reproduce the data the :requests runs used (the
# digest in data/self_distill/smollm2_requests/plan.json, over their ids and settings).
BASIC_REQUESTS_SHA256 = "42e5a4f79a3859d6723fc1a0c3fd272d72ec7b38f21e2d3e3c96bee276ff5e2e"


def test_the_basic_request_prompts_stay_the_ones_the_committed_data_was_made_from():
  """``configs/self_distill_smollm2.py:requests`` made its data from these 512 prompts: adding
  request sets must not change them."""
  import hashlib

  tok = Tokenizer.from_gguf(registry.resolve("smollm2-135m-instruct"))
  prompts = distill_prompts.request_prompts(tok, num_prompts=512, seed=0)
  digest = hashlib.sha256(json.dumps(prompts.texts).encode()).hexdigest()
  assert digest == BASIC_REQUESTS_SHA256


# Topics of the held-out chat prompts (experiments/held_out.json: chat and chat_new). The
# basic set, made before chat_new, names some of them (tips for reading more books, a birthday
# dinner, solving a mystery); the broad set names none.
HELD_OUT_TOPICS = (
  "tea", "robot", "paint", "studying", "focused", "books?", "novels?", "mystery", "onions?",
  "cars?", "birthday", "card", "bakery", "shops?", "customers",
)  # fmt: skip


def test_broad_requests_name_no_topic_of_a_held_out_chat_prompt():
  chats = " ".join([*held_out.CATEGORIES["chat"], *held_out.CHAT_NEW]).lower()
  topic = re.compile(rf"\b({'|'.join(HELD_OUT_TOPICS)})\b")
  assert len(set(topic.findall(chats))) >= 12  # the list does name the held-out topics
  named = sorted(r for r in distill_prompts.all_requests("broad") if topic.search(r.lower()))
  assert not named, named
  assert any(topic.search(r.lower()) for r in distill_prompts.all_requests("basic"))


def test_the_broad_config_passes_its_checks_and_names_its_bound():
  config = self_distill_smollm2.get_config("requests_broad")
  task.check(config)
  config.distill.num_prompts = len(distill_prompts.all_requests("broad")) + 1
  with pytest.raises(ValueError, match="'broad' request templates make 1169 distinct"):
    task.check(config)


@pytest.mark.parametrize(
  "change, match",
  [
    ({"distill.tasks": True}, "choose one prompt kind"),
    ({"chat": False}, "requests=True writes user messages: set config.chat=True"),
    ({"distill.sources": ("kjv",)}, "reads no corpus: set config.distill.sources=()"),
    ({"distill.num_prompts": 10**6}, "set num_prompts <= 656"),
    ({"distill.request_set": "wide"}, "request_set='wide' is not a request set: choose one of"),
    ({"target.source": "random"}, "random target gets random token prompts"),
  ],
)
def test_request_config_errors_name_the_field(change, match):
  config = self_distill_smollm2.get_config("requests")
  task.check(config)
  for field, value in change.items():
    section, _, name = field.rpartition(".")
    (config[section] if section else config)[name] = value
  with pytest.raises(ValueError, match=re.escape(match)):
    task.check(config)


def test_task_writes_a_readable_directory(tmp_path, capsys):
  config = self_distill_smollm2.get_config("tiny")
  config.output_dir = str(tmp_path / "out")
  config.target.update(vocab_size=64, dim=32, num_layers=2, num_heads=2, num_kv_heads=1, ffn_dim=64)
  manifest = task.run(config)
  assert manifest["num_examples"] == config.distill.num_prompts
  saved = json.loads((tmp_path / "out" / data.MANIFEST).read_text())
  assert saved["shards"] == manifest["shards"]
  ds = data.load_dataset([config.output_dir], None, seq_len=config.max_len, max_examples=None)
  assert len(ds) == config.distill.num_prompts
  assert ds.mask.sum() == config.distill.num_prompts * config.max_new_tokens  # No EOS here.
  assert "wrote 10 examples" in capsys.readouterr().out


@pytest.mark.slow
def test_task_runs_on_the_real_model_with_corpus_prompts(tmp_path, capsys):
  """SmolLM2 with its tokenizer: the prompts come from the corpora, not ``config.prompts``."""
  config = self_distill_smollm2.get_config("greedy")
  config.output_dir = str(tmp_path / "out")
  config.distill.update(num_prompts=4, shard_size=4)
  config.update(batch_size=4, max_new_tokens=3)
  assert not config.prompts
  manifest = task.run(config)
  assert manifest["num_examples"] == 4
  assert "wrote 4 examples" in capsys.readouterr().out


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(shard_size=4), "shard_size=4 must be a positive multiple of batch_size=3"),
    (dict(max_len=12), "raise max_len or shorten the prompt"),
    (dict(capture_layers=(2,)), "capture_layers [2] are outside [0, 2)"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(temperature=-1.0), "temperature must be finite and >= 0"),
  ],
)
def test_bad_distill_input_is_a_clear_error(model, prompts, tmp_path, change, message):
  cfg, params = model
  with pytest.raises(ValueError) as e:
    distill.self_distill(params, cfg, prompts, tmp_path, progress=False, **(KW | change))
  assert message in str(e.value)
  assert not any(tmp_path.iterdir())  # Checked before anything is written.


def test_bad_directory_and_config_are_clear_errors(model, prompts, tmp_path):
  cfg, params = model
  (tmp_path / "notes.txt").write_text("x")
  with pytest.raises(ValueError, match="is not empty"):
    distill.self_distill(params, cfg, prompts, tmp_path, progress=False, **KW)
  config = self_distill_smollm2.get_config("tiny")
  config.distill.sources = ("kjv",)
  with pytest.raises(ValueError, match="config.distill.sources needs a target with a tokenizer"):
    task.run(config)
  config = self_distill_smollm2.get_config()
  config.distill.sources = ("poems",)
  with pytest.raises(ValueError, match="unknown corpus 'poems'"):
    task.check(config)
  with pytest.raises(ValueError, match="unknown variant"):
    self_distill_smollm2.get_config("huge")


@pytest.mark.parametrize(
  "variant, change, message",
  [
    (  # said "prompt 0 has 15 tokens + max_new_tokens 16 > max_len 20", of generated prompts
      "tiny",
      {"max_len": 20},
      r"^config.distill.prompt_max_tokens=16 \+ config.max_new_tokens=16 > config.max_len=20",
    ),
    ("tiny", {"distill.capture_layers": (99,)}, r"^config.distill.capture_layers=\(99,\) .*\[0, "),
    (
      "greedy",
      {"distill.sources": ("nosuch",)},
      r"^config.distill.sources: unknown corpus 'nosuch'",
    ),
  ],
)
def test_self_distill_config_errors_name_the_field_before_the_target_loads(
  tmp_path, monkeypatch, variant, change, message
):
  from specjax import build

  monkeypatch.setattr(build, "target", lambda config: pytest.fail("the target loaded"))
  config = self_distill_smollm2.get_config(variant)
  config.output_dir = str(tmp_path / "out")
  for field, value in change.items():
    section, _, name = field.rpartition(".")
    (config[section] if section else config)[name] = value
  with pytest.raises(ValueError, match=message):
    task.run(config)


def test_a_directory_that_is_not_the_runs_is_refused_before_the_target_loads(tmp_path, monkeypatch):
  """task=self_distill into a directory holding the user's own files, or a finished run: one
  error naming it, before the target is read (the model of a real config takes minutes to
  load), and the files are left as they were."""
  from specjax import build

  loads = []
  monkeypatch.setattr(build, "target", lambda config: loads.append(config) or 1 / 0)
  config = self_distill_smollm2.get_config("tiny")
  config.output_dir = str(tmp_path)
  (tmp_path / "notes.txt").write_text("x")
  with pytest.raises(ValueError, match=f"^config.output_dir: {tmp_path} is not empty"):
    task.run(config)
  (tmp_path / "notes.txt").unlink()
  (tmp_path / data.MANIFEST).write_text("{}")
  with pytest.raises(ValueError, match="already holds a finished self-distillation"):
    task.run(config)
  assert not loads and [f.name for f in tmp_path.iterdir()] == [data.MANIFEST]


def test_shards_of_another_target_are_refused_before_it_loads(tmp_path):
  """Shards whose manifest names another vocabulary (or tokenizer) than config.target's: one
  error naming both targets, from the train task's plan (nothing loaded); shards written before
  the manifest recorded its target still train."""
  config = train_tiny.get_config()  # a random target of vocabulary 256
  made = {"name": "tiny-target", "vocab_size": 512, "tokenizer_fingerprint": None}
  cases = {"other": {"target": made}, "same": {"target": made | {"vocab_size": 256}}, "old": {}}
  for name, fields in cases.items():
    (tmp_path / name).mkdir()
    manifest = {"format": data.SHARD_FORMAT, "model": "tiny-target", "shards": []} | fields
    (tmp_path / name / data.MANIFEST).write_text(json.dumps(manifest))
  message = (
    r"self-distilled by target 'tiny-target' \(vocabulary 512, no tokenizer\), but config.target "
    r"is 'tiny-target' \(vocabulary 256, no tokenizer\): its token ids mean other tokens"
  )
  config.data.sources = (str(tmp_path / "other"),)
  with pytest.raises(ValueError, match=message):
    train_task.plan(config)
  for name in ("same", "old"):
    config.data.sources = (str(tmp_path / name),)
    train_task.plan(config)
