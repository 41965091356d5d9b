"""Medusa heads in FasterDecoding's and vLLM's layouts: read, written, decoded, refused.

FasterDecoding's heads are built by its own code (``medusa.model.medusa_model``, installed as
the oracle) and saved with torch; vLLM's layout is written here from the tensor names and
config fields of vLLM's ``model_executor/models/medusa.py`` (vLLM itself does not install on
this machine), and its computation (token_map scatter included) is spelled out in numpy.
"""

import collections
import functools
import json
import tempfile
import zipfile

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
ref = pytest.importorskip("medusa.model.medusa_model")
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import save_file as np_save_file  # noqa: E402
from safetensors.torch import load_file as torch_load_file  # noqa: E402
from safetensors.torch import save_file as torch_save_file  # noqa: E402

from configs import train_tiny  # noqa: E402
from specjax import build, testing  # noqa: E402
from specjax.decode import generate  # noqa: E402
from specjax.drafters import medusa  # noqa: E402
from specjax.drafters.medusa import formats as layouts  # noqa: E402
from specjax.models import (  # noqa: E402
  source,
  tiny,
  torch_files,  # noqa: E402
)
from specjax.trees import Tree  # noqa: E402

F, V = 32, 64  # the tiny target's hidden size and vocabulary


@pytest.fixture(scope="module")
def target():
  return source.Model(*tiny.random_model(seed=0, vocab_size=V, dim=F, num_layers=3))


@functools.cache
def _base_tokenizer() -> str:
  """A local base-model directory holding a tokenizer (a word-level one over the tiny
  vocabulary), which ``MedusaModel``'s constructor loads with transformers' ``AutoTokenizer``."""
  directory = tempfile.mkdtemp(prefix="medusa-base-")
  words = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"t{i}": i for i in range(V)}, "t0"))
  transformers.PreTrainedTokenizerFast(tokenizer_object=words).save_pretrained(directory)
  return directory


def reference_heads(dim, vocab, num_heads, num_layers, seed=0):
  """FasterDecoding's ``MedusaModel.medusa_head``, built by its own constructor (over a small
  base model whose tokenizer it loads from a local directory) and given random weights."""

  class Base(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.lm_head = torch.nn.Linear(dim, vocab, bias=False)
      self.config, self.dtype, self.device = None, torch.float32, torch.device("cpu")

  model = ref.MedusaModel(Base(), num_heads, num_layers, _base_tokenizer())
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.medusa_head.parameters():
      p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
  return model.medusa_head


def reference_logits(heads, h_NxF: np.ndarray) -> np.ndarray:
  """``[N, H, V]`` FasterDecoding's forward: ``medusa_head[k](h)`` for every head."""
  with torch.no_grad():
    return np.stack([head(torch.from_numpy(h_NxF)).numpy() for head in heads], axis=1)


def save_reference(heads, directory, kind="pt", num_heads_in_config=2):
  """A published-style directory: config.json (under-reporting its heads, as published ones
  do) and ``medusa_lm_head.pt`` or ``.safetensors``."""
  directory.mkdir(parents=True, exist_ok=True)
  num_layers = len(heads[0]) - 1
  ref.MedusaConfig(
    medusa_num_heads=num_heads_in_config, medusa_num_layers=num_layers,
    base_model_name_or_path="tiny-base",
  ).save_pretrained(directory)  # fmt: skip
  sd = heads.state_dict()
  if kind == "pt":
    torch.save(sd, directory / "medusa_lm_head.pt")
  else:
    torch_save_file(
      {k: v.contiguous() for k, v in sd.items()}, directory / "medusa_lm_head.safetensors"
    )
  return directory


H_F = np.random.default_rng(0).normal(size=(5, F)).astype(np.float32)


def specjax_logits(params, h_NxF=H_F) -> np.ndarray:
  return np.asarray(medusa.head_logits(params, jax.numpy.asarray(h_NxF)))


# --- torch files without torch -------------------------------------------------------------------


def test_torch_files_read_what_torch_save_wrote(tmp_path):
  """fp32, fp16, bf16, int64, a parameter, transposed and sliced views, shared storage."""
  w = torch.randn(6, 4)
  sd = collections.OrderedDict(
    w=w, wt=w.t(), rows=w[2:5], strided=w.t()[1:, ::2], half=torch.randn(3, 5).half(),
    bf16=torch.randn(4, 3, dtype=torch.bfloat16), ids=torch.arange(7) * 3,
    param=torch.nn.Parameter(torch.randn(5)), scalar=torch.tensor(2.5),
  )  # fmt: skip
  torch.save(sd, tmp_path / "x.pt")
  got = torch_files.read_tensors(tmp_path / "x.pt")
  shapes = torch_files.read_shapes(tmp_path / "x.pt")
  assert list(got) == list(sd)
  for name, t in sd.items():
    want = t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()
    assert got[name].shape == want.shape == shapes[name].shape, name
    assert str(got[name].dtype) == str(t.dtype).removeprefix("torch."), name
    np.testing.assert_array_equal(got[name].astype(want.dtype), want, err_msg=name)
  # What specjax writes, torch and safetensors read back bit for bit.
  torch_files.write_torch(tmp_path / "y.pt", got)
  torch_files.write_safetensors(tmp_path / "y.safetensors", got)
  back = torch.load(tmp_path / "y.pt", weights_only=True)
  for other in (back, torch_load_file(tmp_path / "y.safetensors")):
    assert all(torch.equal(other[k], sd[k].detach()) for k in sd)
  np.testing.assert_array_equal(torch_files.read_tensors(tmp_path / "y.safetensors")["bf16"],
                                got["bf16"])  # fmt: skip


# --- FasterDecoding's layout ---------------------------------------------------------------------


@pytest.mark.parametrize(
  "kind,num_layers", [("pt", 1), ("pt", 2), ("safetensors", 1)], ids=["pt", "pt-2layers", "st"]
)
def test_reference_heads_load_with_the_reference_logits(tmp_path, monkeypatch, target, kind,
                                                        num_layers):  # fmt: skip
  """4 heads (the config says 2): every head's logits are FasterDecoding's forward's. With two
  layers the reference repeats one block, saved as two names over one storage."""
  heads = reference_heads(F, V, 4, num_layers)
  d = save_reference(heads, tmp_path / "published", kind)
  assert layouts.detect(d) == "medusa"
  cfg, params, meta = medusa.load(d, target)
  assert (cfg.num_heads, cfg.num_layers, cfg.vocab_size, cfg.own_proj) == (4, num_layers, V, True)
  assert meta["layout"] == "medusa" and meta["tree"] is None
  np.testing.assert_allclose(specjax_logits(params), reference_logits(heads, H_F), atol=1e-4)


def test_a_transposed_weight_changes_the_logits(tmp_path, monkeypatch, target):
  """The comparison has teeth: head 1's residual weight saved transposed (a strided view in
  the file) loads, but its logits are no longer the reference's; the other heads' still are."""
  heads = reference_heads(F, V, 3, 1)
  sd = heads.state_dict()
  sd["1.0.linear.weight"] = sd["1.0.linear.weight"].t()
  (tmp_path / "bad").mkdir()
  torch.save(sd, tmp_path / "bad" / "medusa_lm_head.pt")
  _, params, _ = medusa.load(tmp_path / "bad", target)
  got, want = specjax_logits(params), reference_logits(heads, H_F)
  np.testing.assert_allclose(got[:, [0, 2]], want[:, [0, 2]], atol=1e-4)
  with pytest.raises(AssertionError):
    np.testing.assert_allclose(got[:, 1], want[:, 1], atol=1e-4)


# --- vLLM's layout -------------------------------------------------------------------------------


def vllm_directory(directory, num_heads=3, num_layers=2, draft=24, full_rows=False, seed=0):
  """vLLM's Medusa checkpoint: blocks/lm_heads/token_map (a draft vocabulary of ``draft`` ids),
  biases (medusa_fc_bias), a logit_scale; ``full_rows``: lm_heads over the whole vocabulary."""
  rng = np.random.default_rng(seed)
  ids = rng.permutation(V)[:draft].astype(np.int64)
  t = {"token_map": ids}
  for k in range(num_heads):
    for j in range(num_layers):
      t[f"blocks.{k}.layers.{j}.weight"] = (0.3 * rng.normal(size=(F, F))).astype(np.float32)
      t[f"blocks.{k}.layers.{j}.bias"] = (0.3 * rng.normal(size=F)).astype(np.float32)
    t[f"lm_heads.{k}.weight"] = rng.normal(size=(V if full_rows else draft, F)).astype(np.float32)
  directory.mkdir(parents=True)
  np_save_file(t, str(directory / "model.safetensors"))
  cfg = {
    "architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": F,
    "vocab_size": V, "medusa_num_heads": num_heads, "num_hidden_layers": num_layers,
    "truncated_vocab_size": draft, "medusa_fc_bias": True, "logit_scale": 0.5,
  }  # fmt: skip
  (directory / "config.json").write_text(json.dumps(cfg))
  return directory, t, cfg


def vllm_logits(t, cfg, h_NxF) -> np.ndarray:
  """``[N, H, V]`` vLLM's Medusa: residual blocks, each head's lm_head (rows of the token_map
  when it covers the whole vocabulary), logits * logit_scale, -inf outside the token_map."""
  silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
  ids = t["token_map"]
  out = []
  for k in range(cfg["medusa_num_heads"]):
    x = h_NxF.astype(np.float64)
    for j in range(cfg["num_hidden_layers"]):
      x = x + silu(x @ t[f"blocks.{k}.layers.{j}.weight"].T + t[f"blocks.{k}.layers.{j}.bias"])
    lm = t[f"lm_heads.{k}.weight"]
    lm = lm[ids] if lm.shape[0] > len(ids) else lm
    full = np.full((len(x), cfg["vocab_size"]), -np.inf)
    full[:, ids] = x @ lm.T * cfg["logit_scale"]
    out.append(full)
  return np.stack(out, axis=1)


@pytest.mark.parametrize("full_rows", [False, True], ids=["draft-rows", "full-rows"])
def test_vllm_heads_load_with_vllms_logits(tmp_path, target, full_rows):
  d, t, cfg = vllm_directory(tmp_path / "vllm", full_rows=full_rows)
  assert layouts.detect(d) == "vllm_medusa"
  heads, params, _ = medusa.load(d, target)
  assert (heads.num_heads, heads.num_layers, heads.vocab_size, heads.reduced) == (3, 2, 24, True)
  np.testing.assert_array_equal(params["vocab_ids"], t["token_map"])
  got = np.full((len(H_F), 3, V), -np.inf)
  got[:, :, np.asarray(params["vocab_ids"])] = specjax_logits(params)
  np.testing.assert_allclose(got, vllm_logits(t, cfg, H_F), atol=1e-4)


# --- exporting -----------------------------------------------------------------------------------


class VllmMedusaNames(torch.nn.Module):
  """vLLM's Medusa module tree (``blocks.{k}.layers.{j}``, ``lm_heads.{k}``) with plain
  linear layers, to check an export's names and shapes by a strict ``load_state_dict``."""

  def __init__(self, dim, rows, num_heads, num_layers, bias):
    super().__init__()
    block = lambda: torch.nn.Module()  # noqa: E731
    self.blocks = torch.nn.ModuleList([block() for _ in range(num_heads)])
    for b in self.blocks:
      b.layers = torch.nn.ModuleList(
        [torch.nn.Linear(dim, dim, bias=bias) for _ in range(num_layers)]
      )
    self.lm_heads = torch.nn.ModuleList(
      [torch.nn.Linear(dim, rows, bias=False) for _ in range(num_heads)]
    )


@pytest.mark.parametrize("fmt", ["medusa", "vllm_medusa"])
def test_export_loads_in_the_reference_and_round_trips(tmp_path, monkeypatch, target, fmt):
  """specjax heads written in each layout: the reference module loads them strictly and
  computes specjax's logits; reading them back gives the same tensors, bit for bit."""
  reduced = None if fmt == "medusa" else tuple(range(0, V, 3))
  drafter, params = testing.medusa_drafter(target.cfg, Tree.from_spec((2, 1)), 3, reduced, seed=1)
  heads = drafter.heads
  out = layouts.export(heads, params, tmp_path / fmt, fmt, base_model="tiny-base")
  cfg_json = json.loads((out / "config.json").read_text())
  want = specjax_logits(params)
  if fmt == "medusa":
    assert ref.MedusaConfig.from_pretrained(out).medusa_num_heads == 3
    module = reference_heads(F, V, 3, 1, seed=9)
    module.load_state_dict(torch.load(out / "medusa_lm_head.pt", weights_only=True), strict=True)
    np.testing.assert_allclose(reference_logits(module, H_F), want, atol=1e-4)
    st = torch_load_file(out / "medusa_lm_head.safetensors")
    assert all(torch.equal(st[k], v) for k, v in module.state_dict().items())
  else:
    assert cfg_json["truncated_vocab_size"] == len(reduced) and cfg_json["medusa_fc_bias"]
    st = torch_load_file(out / "model.safetensors")
    token_map = st.pop("token_map")
    module = VllmMedusaNames(F, len(reduced), 3, 1, bias=True)
    module.load_state_dict(st, strict=True)
    t = {k: v.numpy() for k, v in st.items()} | {"token_map": token_map.numpy()}
    scattered = np.full((len(H_F), 3, V), -np.inf)
    scattered[:, :, list(reduced)] = want
    np.testing.assert_allclose(vllm_logits(t, cfg_json | {"logit_scale": 1.0,
                               "medusa_num_heads": 3}, H_F), scattered, atol=1e-4)  # fmt: skip
  again, back, _ = layouts.read(out)
  assert again == heads
  for k in ("res_w", "res_b", "proj", "vocab_ids"):
    np.testing.assert_array_equal(back[k], np.asarray(params[k]), err_msg=k)
  assert not list(tmp_path.glob(".*tmp"))  # written atomically


def test_converting_fasterdecoding_heads_to_vllms_layout_keeps_their_logits(
  tmp_path, monkeypatch, target, capsys
):
  """``python -m specjax.drafters.medusa.formats SRC OUT --format=vllm_medusa``: a published
  directory (bf16 written, within bf16's rounding) becomes vLLM's layout with every head's
  logits."""
  heads = reference_heads(F, V, 3, 1)
  src = save_reference(heads, tmp_path / "published")
  layouts.main([str(src), str(tmp_path / "vllm"), "--format=vllm_medusa", "--dtype=bfloat16"])
  assert "'medusa' layout" in capsys.readouterr().out
  assert layouts.detect(tmp_path / "vllm") == "vllm_medusa"
  assert torch_load_file(tmp_path / "vllm" / "model.safetensors")["lm_heads.0.weight"].dtype == (
    torch.bfloat16
  )
  _, params, _ = medusa.load(tmp_path / "vllm", target)
  np.testing.assert_allclose(specjax_logits(params), reference_logits(heads, H_F), atol=0.1)


# --- decoding ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_published_heads_decode_as_autoregressive_through_the_config(tmp_path, monkeypatch):
  """drafter.medusa.path at a FasterDecoding directory: config check, build, generate; the
  greedy tokens are the target's own."""
  c = train_tiny.get_config()
  c.drafter.name = "medusa"
  c.drafter.medusa.tree_spec = (2, 2, 1)
  heads = reference_heads(c.target.dim, c.target.vocab_size, 3, 1, seed=3)
  c.drafter.medusa.path = str(save_reference(heads, tmp_path / "published"))
  build.check(c)
  target = build.target(c)
  drafter, params = build.drafter(c, target)
  assert drafter.heads.num_heads == 3 and drafter.num_nodes == Tree.from_spec((2, 2, 1)).num_nodes
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
  kw = dict(max_new_tokens=16, max_len=40, eos_id=[5])
  ar = generate(target.params, target.cfg, prompts, **kw)
  out = generate(target.params, target.cfg, prompts, drafter=drafter, drafter_params=params, **kw)
  assert out.tokens == ar.tokens


# --- bad input: one clear error each -------------------------------------------------------------


def _published(tmp_path, monkeypatch, edit=None, kind="pt"):
  heads = reference_heads(F, V, 3, 1)
  d = save_reference(heads, tmp_path / "p", kind)
  if edit is not None:
    sd = heads.state_dict()
    edit(sd)
    torch.save(sd, d / "medusa_lm_head.pt")
  return d


class Evil:
  def __reduce__(self):
    return (print, ("this ran",))


def _export_reduced_as_medusa(tmp_path, target):
  drafter, params = testing.medusa_drafter(target.cfg, Tree.from_spec((1,)), 1, tuple(range(32)))
  return layouts.export(drafter.heads, params, tmp_path / "out", "medusa")


def _truncate(path):
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


BAD = {
  "a tensor missing": (
    r"(?s)missing \['1\.0\.linear\.bias'\].*1\.0\.linear\.bias \[32\]",
    lambda tp, mp, t: medusa.load(_published(tp, mp, lambda sd: sd.pop("1.0.linear.bias")), t),
  ),
  "a misshapen tensor": (
    r"(?s)misshapen \['2\.1\.weight \[64, 31\]'\].*2\.1\.weight \[64, 32\]",
    lambda tp, mp, t: medusa.load(
      _published(tp, mp, lambda sd: sd.update({"2.1.weight": sd["2.1.weight"][:, 1:]})), t
    ),
  ),
  "a target of another hidden size": (
    r"hidden size 32 and vocabulary 64.*target 'tiny' \(hidden size 48, vocabulary 64\)",
    lambda tp, mp, t: medusa.load(
      _published(tp, mp), source.Model(*tiny.random_model(vocab_size=V, dim=48, num_layers=1))
    ),
  ),
  "a truncated torch file": (
    r"medusa_lm_head\.pt is damaged or truncated .*download or copy it again",
    lambda tp, mp, t: (
      _truncate(_published(tp, mp) / "medusa_lm_head.pt"),
      medusa.load(tp / "p", t),
    ),
  ),  # fmt: skip
  "a truncated safetensors file": (
    r"medusa_lm_head\.safetensors is damaged or truncated",
    lambda tp, mp, t: (
      _truncate(_published(tp, mp, kind="st") / "medusa_lm_head.safetensors"),
      medusa.load(tp / "p", t),
    ),
  ),  # fmt: skip
  "a pickle with a forbidden global": (
    r"asks for (builtins|__builtin__)\.print.*refusing",
    lambda tp, mp, t: medusa.load(_published(tp, mp, lambda sd: sd.update(evil=Evil())), t),
  ),
  "a format the directory does not hold": (
    r"config\.drafter\.medusa\.format='vllm_medusa'.*holds the 'medusa' layout",
    lambda tp, mp, t: medusa.load(_published(tp, mp), t, "vllm_medusa"),
  ),
  "an unknown format": (
    r"config\.drafter\.medusa\.format='hf' is unknown",
    lambda tp, mp, t: build.check(_config(tp, format="hf")),
  ),
  "a reduced vocabulary in FasterDecoding's layout": (
    r"no place for a reduced vocabulary.*vllm_medusa",
    lambda tp, mp, t: _export_reduced_as_medusa(tp, t),
  ),  # fmt: skip
}


def _config(tmp_path, **medusa_fields):
  c = train_tiny.get_config()
  c.drafter.name = "medusa"
  c.drafter.medusa.update(medusa_fields)
  return c


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_clear_error(tmp_path, monkeypatch, target, capsys, case):
  match, call = BAD[case]
  with pytest.raises(ValueError, match=match) as e:
    call(tmp_path, monkeypatch, target)
  assert "Traceback" not in str(e.value) and e.value.__cause__ is None
  assert "this ran" not in capsys.readouterr().out  # the forbidden global never ran
  assert not list(tmp_path.glob(".*tmp"))


def test_zip_without_a_pickle_is_refused(tmp_path):
  with zipfile.ZipFile(tmp_path / "x.pt", "w") as z:
    z.writestr("x/version", "3\n")
  with pytest.raises(ValueError, match="holds no data.pkl"):
    torch_files.read_tensors(tmp_path / "x.pt")
