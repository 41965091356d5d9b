"""The prompts self-distillation asks the target with: data, in ``prompt_templates.json``.

- ``INSTRUCTIONS``: the user-message wrapper of each non-chat corpus (chat mode); chitchat is
  already a chat. ``{text}`` is the corpus window.
- ``TASKS``: what an assistant is asked to do with a corpus window (``tasks=True``), so the
  replies are answers, summaries, rewrites and code rather than continuations; one is drawn
  per prompt.
- ``REQUEST_SETS``: ``{name: (templates, slots)}``, assistant requests made with no passage to
  work from (advice, explanations, stories, plans, letters; ``distill.request_prompts``). Each
  ``{slot}`` of a template is filled from its set's ``slots[slot]``. The "basic" set's 26
  templates make 656 distinct requests; the "broad" set's 44 others (recipes, trips, rules,
  how things work, history, notes, jokes, and some tips, poems and stories on other topics)
  make 1,169 more, none of them a basic one (``distill.all_requests``). No broad request names
  a topic of a held-out chat prompt (a test checks): those stay held out for measuring.

A new set is a new entry under ``request_sets`` in the JSON; editing an existing set changes
the data every run that names it trains on.
"""

import json
from pathlib import Path

_DATA = json.loads(Path(__file__).with_name("prompt_templates.json").read_text())

INSTRUCTIONS: dict[str, str] = dict(_DATA["instructions"])
TASKS: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in _DATA["tasks"].items()}
REQUEST_SETS: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, ...]]]] = {
  name: (tuple(s["templates"]), {slot: tuple(v) for slot, v in s["slots"].items()})
  for name, s in _DATA["request_sets"].items()
}
