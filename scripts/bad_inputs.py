"""Runs bad inputs through the CLI and writes what each gives: message, exit code, time.

    python scripts/bad_inputs.py > docs/bad-inputs.md
    python scripts/bad_inputs.py "top_k" "max_len"   # only the cases whose name has one


Every case is a real ``python -m specjax.run`` process (or the module a case names first, such
as ``specjax.report``) on this machine (the time includes
Python and JAX start-up, about 3 s here); the message is the last line the process printed.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cases(tmp: Path) -> list[tuple[str, list[str]]]:
  (tmp / "a_file").write_text("")
  st = "--config.target.source=safetensors"
  for name in ("hf_no_weights", "hf_bad_tok"):  # HF directories, damaged
    (tmp / name).mkdir()
    (tmp / name / "config.json").write_text("{}")
  (tmp / "hf_bad_tok" / "model.safetensors").write_bytes(b"")
  (tmp / "hf_bad_tok" / "tokenizer.json").write_text("not json")
  _hf_directories(tmp)
  (tmp / "noget.py").write_text("x = 1\n")
  (tmp / "typo.py").write_text(
    "from configs import tiny\ndef get_config():\n  c = tiny.get_config()\n"
    "  return c.drafter.nosuch_section\n"
  )
  tiny, demo = "--config=configs/tiny.py", "--config=configs/demo.py"
  eagle = [demo, "--config.drafter.name=eagle"]
  (tmp / "sweep").mkdir()
  (tmp / "empty").mkdir()
  (tmp / "notes").mkdir()  # a directory of the user's own
  (tmp / "notes" / "notes.txt").write_text("mine")
  (tmp / "garbage.json").write_text("{not json")
  with socket.socket() as sock:  # a free port for a coordinator whose peer never comes
    sock.bind(("127.0.0.1", 0))
    peer = f"127.0.0.1:{sock.getsockname()[1]}"
  (tmp / "shards512").mkdir()  # the manifest of shards self-distilled by a vocabulary-512 target
  (tmp / "shards512" / "manifest.json").write_text(
    '{"format": 1, "model": "tiny-target", "shards": [], "target": {"name": "tiny-target", '
    '"vocab_size": 512, "tokenizer_fingerprint": null}}'
  )
  (tmp / "other.json").write_text('{"rows": []}')
  (tmp / "sweep_typo.py").write_text(
    "from experiments.eagle_smollm2 import config\ndef get_config():\n"
    "  c = config.get_config('sweep_b1')\n  c.sweep.variants = {'lookup': {'name': "
    "'prompt_lookup', 'prompt_lookup': {'num_drft': 2}}}\n  return c\n"
  )
  (tmp / "sweep_bad").mkdir()  # a sweep.json cut short
  (tmp / "sweep_bad" / "sweep.json").write_text('{"config":\n')
  (tmp / "noresults").mkdir()  # an experiment's folder without its results/
  for name in ("README.md", "report.py"):
    shutil.copy(ROOT / "experiments/acceptance_losses" / name, tmp / "noresults" / name)
  drafters = {"eagle": ROOT / "experiments/eagle_smollm2/drafter",
              "medusa": ROOT / "experiments/medusa_smollm2/heads"}  # fmt: skip
  damages = {"flipped": lambda d: d[:-1] + bytes([d[-1] ^ 1]), "truncated": lambda d: d[:-1000],
             "header": lambda d: d[:10] + bytes([d[10] ^ 0xFF]) + d[11:]}  # fmt: skip
  for kind, src in drafters.items():
    for what, damage in damages.items():
      (tmp / f"{kind}_{what}").mkdir()
      for f in src.iterdir():
        data = f.read_bytes()
        (tmp / f"{kind}_{what}" / f.name).write_bytes(
          damage(data) if f.suffix == ".safetensors" else data
        )
  medusa = [demo, "--config.drafter.name=medusa"]
  measured = ROOT / "experiments/eagle_smollm2/results/sweep_b1/sweep.json"
  (tmp / "sweep" / "sweep.json").write_text(measured.read_text())
  bench = "--config=configs/specbench.py"
  q = lambda i, cat, turn: f'{{"question_id": {i}, "category": "{cat}", "turns": ["{turn}"]}}\n'
  (tmp / "question.jsonl").write_text(q(1, "qa", "Why?") + q(2, "rag", "Tell me. " * 200))
  (tmp / "no_turns.jsonl").write_text(q(1, "qa", "Why?") + '{"question_id": 2, "category": "qa"}')
  questions = f"--config.specbench.question_file={tmp}/question.jsonl"
  export = ["--config=configs/export_drafter.py", f"--config.export.out={tmp}/export"]
  (tmp / "mine").mkdir()  # a folder of the user's: an export must not replace it
  (tmp / "mine" / "NOTES.txt").write_text("keep me")
  heads = "--config.export.path=experiments/medusa_smollm2/heads"
  vllm = "--config.export.format=vllm_medusa"
  (tmp / "run").mkdir()  # a finished Medusa run: the committed heads and a train.json
  shutil.copytree(ROOT / "experiments/medusa_smollm2/heads", tmp / "run" / "draft_final")
  (tmp / "run" / "train.json").write_text("{}")
  _published_medusa(tmp)
  _published_eagle3(tmp)
  _published_dflash(tmp)
  chat = ('{"conversations": [{"from": "human", "value": "Hi"}, '
          '{"from": "gpt", "value": "Hello."}]}\n')  # fmt: skip
  (tmp / "chats.jsonl").write_text(chat + '{"conversations": [{"from": "human"\n' + chat)
  (tmp / "nothing.jsonl").write_text('{"text": "a text record"}\n' * 3)
  tiny_run = ["--config=configs/train_tiny.py", f"--config.workdir={tmp}/resumable",
              "--config.train.steps=2", "--config.train.checkpoint_every=1",
              "--config.evaluate.enabled=False", "--config.train.progress=False"]  # fmt: skip
  subprocess.run([sys.executable, "-m", "specjax.run", *tiny_run], cwd=ROOT, check=True,
                 capture_output=True)  # a run to resume: two steps, checkpointed  # fmt: skip
  own = ["--config=experiments/eagle_smollm2/config.py", "--config.data.sources=()",
         "--config.data.feature_cache=", f"--config.workdir={tmp}/own",
         "--config.record_to="]  # fmt: skip
  dflash = [demo, "--config.drafter.name=dflash",
            "--config.drafter.dflash.path=experiments/block_smollm2/drafter"]  # fmt: skip
  peagle = [demo, "--config.drafter.name=peagle",
            "--config.drafter.peagle.path=experiments/block_smollm2/drafter_peagle"]  # fmt: skip
  block_train = ["--config=experiments/block_smollm2/config.py", f"--config.workdir={tmp}/block",
                 "--config.record_to="]  # fmt: skip
  return [
    ("no --config", []),
    ("config file without get_config", [f"--config={tmp}/noget.py"]),
    ("bug inside the config file", [f"--config={tmp}/typo.py"]),
    ("misspelt field", [tiny, "--config.tempreature=0.5"]),
    ("misspelt nested field", [tiny, "--config.drafter.prompt_lookup.max_ngrm=2"]),
    ("temperature=inf", [tiny, "--config.temperature=inf"]),
    ("top_p=1.5", [tiny, "--config.top_p=1.5"]),
    ("seed=-1", [tiny, "--config.seed=-1"]),
    ("unknown task", [tiny, "--config.task=fly"]),
    ("unknown drafter", [tiny, "--config.drafter.name=hydra"]),
    ("benchmark.repeats=0", [demo, "--config.benchmark.repeats=0"]),
    ("device_memory_gib=-1", [tiny, "--config.device_memory_gib=-1"]),
    ("batch_size of 3e9 rows", [tiny, "--config.batch_size=3000000000"]),
    ("random target's num_kv_heads=3 (8 heads)", [tiny, "--config.target.num_kv_heads=3"]),
    ("draft model deeper than the target",
     [demo, "--config.drafter.name=draft_model", "--config.drafter.draft_model.num_layers=99"]),
    ("benchmark.hf_baseline beside a random target",
     [tiny, "--config.task=benchmark", "--config.benchmark.hf_baseline=True"]),
    ("output_dir is a file", [demo, f"--config.output_dir={tmp}/a_file"]),
    ("output_dir not writable", [demo, "--config.output_dir=/proc/specjax"]),
    ("output_dir empty", [demo, "--config.output_dir="]),
    ("output_dir starting with ~ (kept as is after =)", [demo, "--config.output_dir=~/runs"]),
    ("train workdir is a file",
     ["--config=configs/train_tiny.py", f"--config.workdir={tmp}/a_file"]),
    ("train eval_examples fewer than the global batch",
     ["--config=configs/train_tiny.py", "--config.data.eval_examples=8"]),
    ("train eval_examples as many as the rows",
     ["--config=configs/train_tiny.py", "--config.data.eval_examples=576"]),
    ("self_distill output_dir holding other files",
     ["--config=configs/self_distill_smollm2.py:tiny", f"--config.output_dir={tmp}/notes"]),
    ("train resumed with another target's weights",
     [*tiny_run, "--config.train.steps=3", "--config.target.seed=5"]),
    ("train resumed with another global batch",
     [*tiny_run, "--config.train.steps=3", "--config.train.global_batch=8"]),
    ("train resumed on other rows (another data.seed's samples)",
     [*tiny_run, "--config.train.steps=3", "--config.data.seed=1"]),
    ("train record_to is a file",
     ["--config=configs/train_tiny.py", f"--config.record_to={tmp}/a_file"]),
    ("train resume=False over an earlier run's checkpoints",
     [*tiny_run, "--config.train.resume=False"]),
    ("train workdir empty", ["--config=configs/train_tiny.py", "--config.workdir="]),
    ("train workdir holding the user's files",
     ["--config=configs/train_tiny.py", f"--config.workdir={tmp}/mine"]),
    ("optim.b2 outside [0, 1)", ["--config=configs/train_tiny.py", "--config.optim.b2=2.0"]),
    ("optim.end_lr_fraction below 0",
     ["--config=configs/train_tiny.py", "--config.optim.end_lr_fraction=-5"]),
    ("optim.weight_decay=nan",
     ["--config=configs/train_tiny.py", "--config.optim.weight_decay=nan"]),
    ("train eval_batches past the eval set",
     ["--config=configs/train_tiny.py", "--config.train.eval_batches=100"]),
    ("train data.seed=-1", ["--config=configs/train_tiny.py", "--config.data.seed=-1"]),
    ("train tau_temperatures=(inf,)",
     ["--config=configs/train_tiny.py", "--config.evaluate.tau_every=1",
      "--config.evaluate.tau_temperatures=(1e309,)"]),
    ("a stray argument", [demo, "temperature=0.7"]),
    ("GGUF path that does not exist",
     [demo, "--config.target.source=gguf", "--config.target.path=/no/model.gguf"]),
    ("HF directory without config.json", [demo, st, f"--config.target.path={tmp}/empty"]),
    ("HF directory path is a file", [demo, st, f"--config.target.path={tmp}/a_file"]),
    ("HF directory without weights", [demo, st, f"--config.target.path={tmp}/hf_no_weights"]),
    ("HF directory, tokenizer.json not JSON", [demo, st, f"--config.target.path={tmp}/hf_bad_tok"]),
    ("HF directory without tokenizer.json, text prompts",
     [demo, st, f"--config.target.path={tmp}/hf_tiny"]),
    ("HF config.json whose vocab_size disagrees with the weights",
     [demo, st, f"--config.target.path={tmp}/hf_vocab", "--config.prompts=((1, 2),)"]),
    ("HF config.json with a rope_scaling that is not an object",
     [demo, st, f"--config.target.path={tmp}/hf_rope", "--config.prompts=((1, 2),)"]),
    ("source=gguf at a directory",
     [demo, "--config.target.source=gguf", f"--config.target.path={tmp}/empty"]),
    ("source=gguf at a file that is not GGUF",
     [demo, "--config.target.source=gguf", f"--config.target.path={tmp}/a_file"]),
    ("prompt + max_new_tokens > max_len", [demo, "--config.max_len=64"]),
    ("KV cache larger than memory", [demo, "--config.max_len=100000000"]),
    ("mesh.tensor does not divide the heads", [demo, "--config.mesh.tensor=2"]),
    ("batch not divisible by mesh.data", [demo, "--config.mesh.data=2"]),
    ("mesh larger than the devices", [demo, "--config.mesh.data=4", "--config.batch_size=4"]),
    ("mesh.fsdp for decoding", [demo, "--config.mesh.fsdp=2"]),
    ("weights + cache over a stated device memory", [demo, "--config.device_memory_gib=0.25"]),
    ("unknown dtype", [demo, "--config.dtype=fp8"]),
    ("EAGLE tree: total < depth", [*eagle, "--config.drafter.eagle.depth=6",
                                   "--config.drafter.eagle.total=4"]),
    ("EAGLE drafter path missing", [*eagle, "--config.drafter.eagle.path=/no/drafter"]),
    ("EAGLE total=auto without a grid",
     [*eagle, "--config.drafter.eagle.path=experiments/eagle_smollm2/drafter",
      "--config.drafter.eagle.total=auto"]),
    ("EAGLE total=auto, grid of another target",
     [*eagle, "--config.drafter.eagle.path=experiments/eagle_smollm2/drafter",
      "--config.drafter.eagle.total=auto",
      "--config.drafter.eagle.auto_from=experiments/cost_model/results/qwen/cost_model.json"]),
    ("EAGLE total neither a number nor auto",
     [*eagle, "--config.drafter.eagle.path=experiments/eagle_smollm2/drafter",
      "--config.drafter.eagle.total=many"]),
    ("EAGLE lookup branch with total=auto",
     [*eagle, "--config.drafter.eagle.path=experiments/eagle_smollm2/drafter",
      "--config.drafter.eagle.total=auto", "--config.drafter.eagle.lookup=4"]),
    ("EAGLE drafter for another target",
     [*eagle, "--config.drafter.eagle.path=experiments/eagle_smollm2/drafter",
      "--config.target.name=qwen2.5-coder-0.5b-instruct"]),
    ("EAGLE training: unknown input ablation",
     ["--config=configs/train_tiny.py", "--config.objective.name=eagle",
      "--config.objective.eagle.inputs=embedding"]),
    ("Medusa tree deeper than the heads", [demo, "--config.drafter.name=medusa",
                                           "--config.drafter.medusa.tree_spec=(2,2,2,2,2)"]),
    ("Medusa tree_spec beside heads with a saved tree",
     [*medusa, "--config.drafter.medusa.path=experiments/medusa_smollm2/heads",
      "--config.drafter.medusa.tree_spec=(3,2,2,1)"]),
    ("num_draft=auto without a curve", [demo, "--config.drafter.name=draft_model",
                                        "--config.drafter.draft_model.num_draft=auto"]),
    ("num_draft=auto, curve of another draft",
     [demo, "--config.drafter.name=draft_model", "--config.drafter.draft_model.num_draft=auto",
      "--config.drafter.draft_model.num_layers=4",
      "--config.drafter.draft_model.auto_from=experiments/cost_model/results/smollm2/cost_model.json"]),
    ("prompt lookup auto, grid of another target, no fallback",
     [demo, "--config.target.name=qwen2.5-coder-0.5b-instruct",
      "--config.drafter.prompt_lookup.auto_fallback=0"]),
    ("prompt lookup auto as a tree", [demo, "--config.drafter.prompt_lookup.num_branches=2"]),
    ("cost model: unknown chip", ["--config=experiments/cost_model/config.py",
                                  "--config.cost_model.chips=('B300',)"]),
    ("cost model at temperature 1", ["--config=experiments/cost_model/config.py",
                                     "--config.temperature=1.0"]),
    ("sweep resumed over another config's sweep.json",
     ["--config=experiments/eagle_smollm2/config.py:sweep_b1", "--config.sweep.resume=True",
      "--config.max_new_tokens=32", f"--config.output_dir={tmp}/sweep"]),
    ("specbench: no question file", [bench]),
    ("specbench: question file missing", [bench, "--config.specbench.question_file=/no/q.jsonl"]),
    ("specbench: question file is a directory",
     [bench, f"--config.specbench.question_file={tmp}/empty"]),
    ("specbench: a line without turns",
     [bench, f"--config.specbench.question_file={tmp}/no_turns.jsonl"]),
    ("specbench: unknown category", [bench, questions, "--config.specbench.categories=poetry"]),
    ("specbench: per_category=0", [bench, questions, "--config.specbench.per_category=0"]),
    ("specbench: question + max_new_tokens > max_len", [bench, questions, "--config.max_len=512"]),
    ("int field given 1.5", [tiny, "--config.top_k=1.5"]),
    ("num_draft given 4.0", [tiny, "--config.drafter.draft_model.num_draft=4.0"]),
    ("int field given text", [tiny, "--config.max_new_tokens=abc"]),
    ("dict field given ()", ["--config=experiments/cost_model/config.py",
                             "--config.sweep.variants=()"]),
    ("max_new_tokens=0", [tiny, "--config.max_new_tokens=0"]),
    ("max_len smaller than the prompt", [tiny, "--config.max_len=10"]),
    ("max_len=0", [tiny, "--config.max_len=0"]),
    ("an empty prompt row", [tiny, "--config.prompts=((1, 2), ())"]),
    ("a prompt id outside the vocabulary", [tiny, "--config.prompts=((1, 512),)"]),
    ("a negative prompt id", [tiny, "--config.prompts=((-1, 2),)"]),
    ("prompt ids not inside a tuple", [tiny, "--config.prompts=(1, 2, 3)"]),
    ("a prompt that is None", [tiny, "--config.prompts=(None,)"]),
    ("sweep category without prompts", ["--config=experiments/eagle_smollm2/config.py:sweep_b1",
                                        "--config.sweep.categories.code=()"]),
    ("sweep variant with a misspelt field", [f"--config={tmp}/sweep_typo.py"]),
    ("sweep resumed over a damaged sweep.json",
     ["--config=experiments/eagle_smollm2/config.py:sweep_b1", "--config.sweep.resume=True",
      f"--config.output_dir={tmp}/sweep_bad"]),
    ("sweep batch_sizes=(0,)", ["--config=experiments/eagle_smollm2/config.py:sweep_b1",
                                "--config.sweep.batch_sizes=(0,)"]),
    ("sweep temperatures listing one twice",
     ["--config=experiments/temperature_sweep/config.py",
      "--config.sweep.temperatures=(0.0, 0.0)"]),
    ("verify_cost sizes not from 1 (0 tokens the baseline)",
     ["--config=experiments/training_free/config.py", "--config.task=verify_cost",
      "--config.sweep.verify_sizes=(0,2)", f"--config.output_dir={tmp}/verify_cost"]),
    ("cost_model.max_k=0", ["--config=experiments/cost_model/config.py",
                            "--config.cost_model.max_k=0", f"--config.output_dir={tmp}/cm"]),
    ("losslessness.samples=1000 (rows are drawn 4000 per call)",
     ["--config=experiments/losslessness/config.py", "--config.losslessness.samples=1000",
      f"--config.output_dir={tmp}/losslessness"]),
    ("EAGLE drafter with one flipped data byte",
     [*eagle, f"--config.drafter.eagle.path={tmp}/eagle_flipped"]),
    ("Medusa heads with one flipped data byte",
     [*medusa, f"--config.drafter.medusa.path={tmp}/medusa_flipped"]),
    ("truncated EAGLE drafter file",
     [*eagle, f"--config.drafter.eagle.path={tmp}/eagle_truncated"]),
    ("truncated Medusa heads file",
     [*medusa, f"--config.drafter.medusa.path={tmp}/medusa_truncated"]),
    ("EAGLE drafter file with a damaged header",
     [*eagle, f"--config.drafter.eagle.path={tmp}/eagle_header"]),
    ("Medusa heads given as the EAGLE drafter",
     [*eagle, "--config.drafter.eagle.path=experiments/medusa_smollm2/heads"]),
    ("EAGLE drafter given as Medusa heads",
     [*medusa, "--config.drafter.medusa.path=experiments/eagle_smollm2/drafter"]),
    ("medusa.num_heads=0", [*medusa, "--config.drafter.medusa.path=",
                            "--config.drafter.medusa.num_heads=0"]),
    ("Medusa heads for another target",
     [*medusa, "--config.drafter.medusa.path=experiments/medusa_smollm2/heads",
      "--config.target.name=qwen2.5-coder-0.5b-instruct"]),
    ("training diverges (optim.learning_rate=1e12)",
     ["--config=configs/train_tiny.py", "--config.optim.learning_rate=1e12",
      f"--config.workdir={tmp}/diverged"]),
    ("auto_from that is not JSON",
     [demo, f"--config.drafter.prompt_lookup.auto_from={tmp}/garbage.json"]),
    ("auto_from JSON that is not a cost model",
     [demo, f"--config.drafter.prompt_lookup.auto_from={tmp}/other.json"]),
    ("training on shards of another target",
     ["--config=configs/train_tiny.py", f"--config.data.sources=('{tmp}/shards512',)",
      f"--config.workdir={tmp}/train"]),
    ("two-process run whose peer never starts",
     ["--config=configs/train_tiny.py", "--config.distributed.num_processes=2",
      "--config.distributed.process_id=0", f"--config.distributed.coordinator_address={peer}",
      "--config.distributed.initialization_timeout_s=5", f"--config.workdir={tmp}/peer"]),
    ("export: specjax's EAGLE architecture for vLLM",
     [*export, "--config.export.path=experiments/eagle_smollm2/drafter",
      "--config.export.format=speculators"]),
    ("published EAGLE-3 drafter of another hidden size",
     [*eagle, f"--config.drafter.eagle.path={tmp}/eagle3_small"]),
    ("export: unknown format", [*export, heads, "--config.export.format=onnx"]),
    ("export: Medusa heads in an EAGLE layout", [*export, heads, "--config.export.format=eagle3"]),
    ("export: no drafter at the path",
     [*export, f"--config.export.path={tmp}/empty", "--config.export.format=medusa"]),
    ("export: a drafter trained for another target",
     [*export, heads, vllm, "--config.target.name=qwen2.5-coder-0.5b-instruct"]),
    ("export: out is a folder holding the user's files",
     [*export[:1], heads, vllm, f"--config.export.out={tmp}/mine"]),
    ("export: out is a file", [*export[:1], heads, vllm, f"--config.export.out={tmp}/a_file"]),
    ("export: out in a folder that cannot be written",
     [*export[:1], heads, vllm, "--config.export.out=/proc/specjax-out"]),
    ("export: out ending in a space", [*export[:1], heads, vllm, f"--config.export.out={tmp}/x "]),
    ("export: a verifier for a layout that records none",
     [*export, heads, vllm, "--config.export.verifier=HuggingFaceTB/SmolLM2-135M-Instruct"]),
    ("export: a reduced vocabulary in FasterDecoding's layout",
     [*export, heads, "--config.export.format=medusa"]),
    ("promote: a run that has not finished",
     ["--config=experiments/eagle_smollm2/config.py:promote", f"--config.promote.run={tmp}"]),
    ("promote: a destination that is not a drafter",
     ["--config=experiments/medusa_smollm2/config.py:promote", f"--config.promote.run={tmp}/run",
      f"--config.promote.to={tmp}"]),  # fmt: skip
    ("published Medusa heads of another hidden size",
     [*medusa, f"--config.drafter.medusa.path={tmp}/fd_small"]),
    ("published Medusa heads, truncated file",
     [*medusa, f"--config.drafter.medusa.path={tmp}/fd_truncated"]),
    ("published Medusa heads, a pickle that runs code",
     [*medusa, f"--config.drafter.medusa.path={tmp}/fd_unsafe"]),
    ("data.files: a malformed line (on_error=stop)",
     [*own, f"--config.data.files=('{tmp}/chats.jsonl',)", "--config.data.format=sharegpt"]),
    ("data.files: nothing usable in the format",
     [*own, f"--config.data.files=('{tmp}/nothing.jsonl',)", "--config.data.format=sharegpt"]),
    ("data.files: a glob that matches nothing",
     [*own, "--config.data.files=('/no/chats/*.jsonl',)", "--config.data.format=sharegpt"]),
    ("data.format unknown",
     [*own, f"--config.data.files=('{tmp}/chats.jsonl',)", "--config.data.format=alpaca"]),
    ("DFlash tree neither '' nor auto", [*dflash, "--config.drafter.dflash.tree=bushy"]),
    ("DFlash tree=auto without a grid", [*dflash, "--config.drafter.dflash.tree=auto"]),
    ("DFlash tree=auto beside tree_spec",
     [*dflash, "--config.drafter.dflash.tree=auto", "--config.drafter.dflash.tree_spec=(2,1)"]),
    ("DFlash tree deeper than the block",
     [*dflash, "--config.drafter.dflash.tree_spec=(1,1,1,1,1,1,1,1)"]),
    ("P-EAGLE tree=auto, grid of another target",
     [*peagle, "--config.drafter.peagle.tree=auto",
      "--config.drafter.peagle.auto_from=experiments/cost_model/results/qwen/cost_model.json"]),
    ("DFlash drafter path missing",
     [demo, "--config.drafter.name=dflash", "--config.drafter.dflash.path=/no/drafter"]),
    ("P-EAGLE drafter given as the DFlash drafter",
     [demo, "--config.drafter.name=dflash",
      "--config.drafter.dflash.path=experiments/block_smollm2/drafter_peagle"]),
    ("DFlash drafter for another target",
     [*dflash, "--config.target.name=qwen2.5-coder-0.5b-instruct"]),
    ("DFlash block_size beside a saved drafter", [*dflash, "--config.drafter.dflash.block_size=0"]),
    ("P-EAGLE drafter for another target",
     [*peagle, "--config.target.name=qwen2.5-coder-0.5b-instruct"]),
    ("published DFlash drafter of another hidden size",
     [demo, "--config.drafter.name=dflash", f"--config.drafter.dflash.path={tmp}/dflash_small"]),
    ("DFlash training: markov_rank=-1", [*block_train, "--config.objective.dflash.markov_rank=-1"]),
    ("DFlash training: anchors=0", [*block_train, "--config.objective.dflash.anchors=0"]),
    ("DFlash training: blocks longer than the rows",
     [*block_train, "--config.objective.dflash.block_size=300"]),
    ("report: folder that does not exist", ["specjax.report", f"{tmp}/nowhere"]),
    ("report: empty folder", ["specjax.report", f"{tmp}/empty"]),
    ("report: a file", ["specjax.report", "experiments/attention_window/README.md"]),
    ("report: an experiment without its results", ["specjax.report", f"{tmp}/noresults"]),
  ]  # fmt: skip


def _hf_directories(tmp: Path) -> None:
  """A tiny HF directory without tokenizer.json, and copies whose config.json disagrees with
  the weights (vocab_size) or holds a rope_scaling that is not an object."""
  import json

  from specjax.models import export, tiny

  cfg, params = tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=2)
  export.save_model(tmp / "hf_tiny", cfg, params)
  for name, change in (("hf_vocab", {"vocab_size": 100}), ("hf_rope", {"rope_scaling": "yes"})):
    shutil.copytree(tmp / "hf_tiny", tmp / name)
    config = json.loads((tmp / name / "config.json").read_text()) | change
    (tmp / name / "config.json").write_text(json.dumps(config))


def _published_medusa(tmp: Path) -> None:
  """FasterDecoding-layout heads for the bad-input cases: a 64-wide set (SmolLM2 is 576
  wide), a truncated file and a pickle whose global is not a tensor's."""
  import pickle
  import zipfile

  import numpy as np

  from specjax.models import torch_files

  config = '{"medusa_num_heads": 1, "medusa_num_layers": 1}'
  small = {"0.0.linear.weight": np.zeros((64, 64), np.float32),
           "0.0.linear.bias": np.zeros((64,), np.float32),
           "0.1.weight": np.zeros((49152, 64), np.float32)}  # fmt: skip
  for name in ("fd_small", "fd_truncated", "fd_unsafe"):
    (tmp / name).mkdir()
    (tmp / name / "config.json").write_text(config)
  torch_files.write_safetensors(tmp / "fd_small" / "medusa_lm_head.safetensors", small)
  torch_files.write_torch(tmp / "fd_truncated" / "medusa_lm_head.pt", small)
  data = (tmp / "fd_truncated" / "medusa_lm_head.pt").read_bytes()
  (tmp / "fd_truncated" / "medusa_lm_head.pt").write_bytes(data[: len(data) // 2])
  with zipfile.ZipFile(tmp / "fd_unsafe" / "medusa_lm_head.pt", "w") as z:
    z.writestr("archive/data.pkl", pickle.dumps(os.system))  # os.system: refused unrun


def _published_eagle3(tmp: Path) -> None:
  """An EAGLE-3 drafter in speculators' layout for a 64-wide target (SmolLM2 is 576 wide)."""
  import jax

  from specjax import testing
  from specjax.drafters.eagle import formats as eagle
  from specjax.models import tiny

  small = tiny.random_model(seed=0, vocab_size=64, dim=64, num_layers=8)
  drafter, params = testing.eagle_drafter(small, features=(1, 3, 4), architecture="eagle3")
  eagle.export(
    drafter.cfg,
    jax.device_get(params),
    tmp / "eagle3_small",
    "speculators",
    verifier="org/tiny-llama",
  )


def _published_dflash(tmp: Path) -> None:
  """A DFlash drafter in speculators' layout for a 64-wide target (SmolLM2 is 576 wide)."""
  import jax

  from specjax.drafters import dflash
  from specjax.models import tiny

  cfg, params = tiny.random_model(seed=0, vocab_size=64, dim=64, num_layers=4)
  dcfg = dflash.DFlashConfig(cfg, (1, 2), num_layers=1, block_size=4)
  trained = dflash.model.init_params(dcfg, jax.random.key(0))
  weights = dflash.model.decode_params(trained, params, cfg)
  dflash.formats.export(dcfg, jax.device_get(weights), tmp / "dflash_small", verifier="org/tiny")


# Cases the harness cannot run alone (a second process holding the lock), or that are not
# errors: measured by hand, printed after the table so the page regenerates whole.
BY_HAND = """
Measured by hand (a second process, or not an error; each is also a test):

| input | what it gives | exit | time |
|---|---|---|---|
| train workdir held by another run | `error: config.workdir='TMP/run' is in use by another training run (pid 25267): wait for it, stop it, or give this run another workdir.` (before the target loads) | 1 | 6.3 s |
| a resumed training run (train.steps=3, then 6) | `resumed from step 3 of 6 (the newest checkpoint in TMP/run/checkpoints; another workdir starts afresh)` (before the first step) | 0 | 33.7 s (the whole run) |
| top_k above the vocabulary | `note: config.top_k=1000 is more than the target's vocabulary (512 tokens): it is clipped to 512, which keeps every token (as top_k=0 does).` (at the config check; the run goes on) | 0 | 55.3 s (the whole run) |
| the README's demo commands with another drafter.name | each writes `results/demo/<drafter.name>/benchmark.json` and prints `wrote results/demo/eagle/benchmark.json` (all wrote `results/demo/benchmark.json` before) | 0 | (a whole run) |
| any run on a machine without a TPU | no `Unable to initialize backend 'tpu'` line first (JAX's INFO line for each backend it could not start; its warnings still show) | - | - |
"""  # noqa: E501


def main() -> None:
  rows = []
  only = sys.argv[1:]
  with tempfile.TemporaryDirectory() as d:
    for name, args in cases(Path(d)):
      if only and not any(o in name for o in only):
        continue
      module = "specjax.run"
      if args and args[0].startswith("specjax."):
        module, args = args[0], args[1:]
      t0 = time.perf_counter()
      proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
        env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=600,
      )  # fmt: skip
      dt = time.perf_counter() - t0
      lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error")]
      msg = (lines or [(proc.stderr.strip().splitlines() or ["(nothing)"])[-1]])[-1]
      msg = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", msg.replace(d, "TMP")).replace("|", "\\|")
      rows.append(f"| {name} | `{msg}` | {proc.returncode} | {dt:.1f} s |")
      print(f"{name}: rc {proc.returncode}, {dt:.1f} s", file=sys.stderr)
  print("| input | message | exit | time |\n|---|---|---|---|")
  print("\n".join(rows))
  if not only:
    print(BY_HAND, end="")


if __name__ == "__main__":
  main()
