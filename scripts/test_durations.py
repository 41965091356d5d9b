"""Where the test suite's time goes, from pytest's JUnit XML: per file, per cause, slowest tests.

    python -m pytest -q --junitxml=results/tests.xml
    python scripts/test_durations.py results/tests.xml [--before OLD.xml] [--top 30] [--record]

Each test's time is its setup + call + teardown in its xdist worker (the sum over tests is
worker time; the wall time is about that over the number of workers). tests/conftest.py adds
to every test the seconds its own process spent tracing, lowering and XLA-compiling, its
markers, its xdist worker and when it ended; a test's subprocesses are counted in its time but
not in those columns. Causes, first that applies: ``multiprocess`` marker (CLI runs,
jax.distributed, emulated meshes), ``real_model`` marker, training (a ``train``/``resume`` test
or test_train*), statistical sampling (an exact-distribution test or its broken variant), else
XLA compiles and tiny-model runs. Prints markdown tables (docs/testing.md quotes them), the
workers' balance among them. ``--record`` writes each file's worker seconds to
``tests/durations.json``, the order in which tests/conftest.py hands files to the workers.
"""

import argparse
import collections
import json
import os
import re
import xml.etree.ElementTree as ET

CAUSES = (
  "subprocesses (CLI, two processes, 8-device meshes)",
  "real models (GGUF loads, HF parity, real decodes)",
  "training runs",
  "statistical sampling (exact-distribution tests)",
  "tiny-model compiles and runs",
)
_SAMPLING = re.compile(r"exact|broken|fails|lossy|stays_exact")
_TRAINING = re.compile(r"train|resume|distil")


def read(path: str) -> list[dict]:
  tests = []
  for case in ET.parse(path).getroot().iter("testcase"):
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    t = {
      "file": case.get("classname").removeprefix("tests."),
      "name": case.get("name"),
      "s": float(case.get("time")),
      "marks": set(filter(None, props.get("marks", "").split(","))),
      "xla_compiles": int(float(props.get("xla_compiles", 0))),
      # tracing + lowering + XLA compiling in the test's own process
      "jax_s": sum(float(props.get(k, 0)) for k in ("xla_compile_s", "trace_s", "lower_s")),
      "worker": props.get("worker"),
      "ended": float(props["ended"]) if "ended" in props else None,
    }
    tests.append(t)
  return tests


def _base(name: str) -> str:
  return name.split("[")[0]


def with_causes(tests: list[dict], marks_from: list[dict] = ()) -> list[dict]:
  """Each test's cause; a run recorded without markers takes them from ``marks_from`` (the same
  test, or a test of the same function when it has been parametrized since)."""
  known = {(t["file"], t["name"]): t["marks"] for t in marks_from}
  known |= {(t["file"], _base(t["name"])): t["marks"] for t in marks_from}
  for t in tests:
    if not t["marks"]:
      same, base = (t["file"], t["name"]), (t["file"], _base(t["name"]))
      t["marks"] = known.get(same) or known.get(base, set())
    t["cause"] = cause(t)
  return tests


def cause(t: dict) -> str:
  if "multiprocess" in t["marks"]:
    return CAUSES[0]
  if "real_model" in t["marks"]:
    return CAUSES[1]
  if _TRAINING.search(t["name"]) or t["file"].startswith("test_train"):
    return CAUSES[2]
  if _SAMPLING.search(t["name"]) or t["file"] == "test_lossless":
    return CAUSES[3]
  return CAUSES[4]


def _by(tests, key) -> dict:
  out = collections.defaultdict(lambda: {"n": 0, "s": 0.0, "jax_s": 0.0})
  for t in tests:
    row = out[key(t)]
    row["n"] += 1
    row["s"] += t["s"]
    row["jax_s"] += t["jax_s"]
  return out


def balance(tests: list[dict]) -> None:
  """Per xdist worker: its tests' seconds and when its last test ended (from the first test's
  start); a worker that ends early leaves its core idle while the other finishes."""
  timed = [t for t in tests if t["worker"] and t["ended"] is not None]
  if not timed:
    return
  start = min(t["ended"] - t["s"] for t in timed)
  ends = {}
  print("| worker | tests | s | last test ended at | the file it ended with |")
  print("|---|---|---|---|---|")
  for w in sorted({t["worker"] for t in timed}):
    mine = [t for t in timed if t["worker"] == w]
    last = max(mine, key=lambda t: t["ended"])
    ends[w] = last["ended"] - start
    file_s = sum(t["s"] for t in mine if t["file"] == last["file"])
    print(
      f"| {w} | {len(mine)} | {sum(t['s'] for t in mine):.0f} | {ends[w]:.0f} s "
      f"| {last['file']} ({file_s:.0f} s) |"
    )
  print(f"\nThe workers ended {max(ends.values()) - min(ends.values()):.0f} s apart.\n")


DURATIONS = "tests/durations.json"


def record(tests: list[dict], path: str = DURATIONS) -> None:
  """Each file's worker seconds in this run, longest first, written whole or not at all."""
  seconds = collections.Counter()
  for t in tests:
    seconds[t["file"]] += t["s"]
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump({k: round(v, 1) for k, v in seconds.most_common()}, f, indent=0)
    f.write("\n")
  os.replace(tmp, path)
  print(f"wrote {path}: {len(seconds)} files\n")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("xml")
  ap.add_argument("--before", help="an earlier run's XML: its seconds beside this run's")
  ap.add_argument("--top", type=int, default=30)
  ap.add_argument("--record", action="store_true", help=f"write {DURATIONS}: files, longest first")
  a = ap.parse_args()
  now = with_causes(read(a.xml))
  if a.record:
    record(now)
  old = with_causes(read(a.before), now) if a.before else []
  total = sum(t["s"] for t in now)
  jax_s = sum(t["jax_s"] for t in now)
  print(
    f"{len(now)} tests, {total:.0f} s of worker time, {jax_s:.0f} s of it tracing, lowering "
    f"and XLA-compiling in the test processes ({100 * jax_s / total:.0f}%)\n"
  )
  for title, key in (("cause", lambda t: t["cause"]), ("file", lambda t: t["file"])):
    rows, before = _by(now, key), _by(old, key)
    head = f"| {title} | tests |" + (" s before |" if old else "") + " s | of which JAX compiles |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for k, r in sorted(rows.items(), key=lambda kv: -kv[1]["s"]):
      prev = f" {before[k]['s']:.0f} |" if old else ""
      print(f"| {k} | {r['n']} |{prev} {r['s']:.0f} | {r['jax_s']:.0f} |")
    print()
  balance(now)
  print("| slowest tests | s | JAX compiles s | XLA compiles | cause |\n|---|---|---|---|---|")
  for t in sorted(now, key=lambda t: -t["s"])[: a.top]:
    print(
      f"| `{t['file']}::{t['name']}` | {t['s']:.1f} | {t['jax_s']:.1f} | {t['xla_compiles']} "
      f"| {t['cause']} |"
    )


if __name__ == "__main__":
  main()
