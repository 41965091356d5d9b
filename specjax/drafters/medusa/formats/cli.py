"""Heads converted from any layout to another:

python -m specjax.drafters.medusa.formats SRC OUT --format=vllm_medusa [--dtype=bfloat16]
"""

import argparse

from specjax.drafters.medusa.formats.read import DTYPES, EXPORTS, FORMATS, read
from specjax.drafters.medusa.formats.write import export


def main(argv=None) -> None:
  """Converts heads from any layout (specjax heads with their own projections) to another."""
  ap = argparse.ArgumentParser(
    prog="python -m specjax.drafters.medusa.formats", description=main.__doc__
  )
  ap.add_argument("src", help="a heads directory: specjax, medusa or vllm_medusa layout")
  ap.add_argument("out", help="the directory to write")
  ap.add_argument("--format", required=True, choices=EXPORTS, help="the layout to write")
  ap.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
  ap.add_argument("--from_format", default="auto", choices=FORMATS, help="the source's layout")
  ap.add_argument("--base_model", default="", help="config.json's base_model_name_or_path")
  a = ap.parse_args(argv)
  heads, params, _ = read(a.src, a.from_format, field="src")
  print(f"wrote {export(heads, params, a.out, a.format, a.dtype, a.base_model)}")
