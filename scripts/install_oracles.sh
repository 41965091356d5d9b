#!/usr/bin/env bash
# Installs the reference implementations that tests/test_interop_*.py compare specjax against:
# SafeAILab's EAGLE (eagle-llm), FasterDecoding's Medusa (medusa-llm), vLLM's speculators and
# SGLang's SpecForge (whose EAGLE-3 model reads the checkpoints SGLang serves).
#
#   bash scripts/install_oracles.sh
#
# Always --no-deps: their pins (torch, transformers, gradio, openai, datasets, ...) conflict with
# specjax's, and the tests import only their model modules, which need torch and transformers
# (the `oracle` extra, which also carries what speculators' package imports: loguru, openai,
# datasets). hs-connectors is speculators' own data plugin, imported by its package. Tests of an
# oracle that is absent are skipped with this command as the fix.
set -euo pipefail

PIP="${PIP:-python -m pip}"
$PIP install --no-deps "eagle-llm==1.2.1" "medusa-llm==0.1" "speculators==0.9.0" \
  "hs-connectors==0.9.0" "specforge==0.2.0"
