"""Self-distillation: the target writes its own continuations of corpus prompts, saved as shards.

    prompts = corpus_prompts(["chitchat", "python"], tok, num_prompts=1024, min_tokens=32,
                             max_tokens=64)
    self_distill(params, cfg, prompts.ids, "data/self_distill/smollm2", max_new_tokens=128,
                 max_len=256, batch_size=32, shard_size=256, temperature=1.0,
                 eos_id=tok.stop_ids, sources=prompts.sources)

``request_prompts`` gives assistant requests made from templates instead (no corpus text:
advice, explanations, stories, letters), for replies of the kind a chat model is asked for.

A drafter is scored by how often the target accepts its tokens, so it learns best from the
target's own output distribution. Prompts are cut from the corpora (``data.py``): chitchat gives
a conversation's turns from a random point, ending on a user turn; the other corpora give a
window of ``min_tokens .. max_tokens`` tokens starting at a random line, wrapped in a short
instruction (``INSTRUCTIONS``) when ``chat`` is on. Generation is ``specjax.decode.generate``,
batch by batch (the last batch is filled by repeating prompts; the extra rows are dropped),
with seed ``seed + batch index``, so a shard is the same whether written in one run or after a
restart.

Directory layout (read back by ``data.read_shards`` / ``data.load_dataset``):

    plan.json          what is being generated (written first; a rerun with the same plan
                       resumes, skipping finished shards)
    shard-00000.npz    tokens [n, max_len] int32: prompt then continuation, 0-padded
                       mask [n, max_len] float32: 1 at positions whose next token was generated
                       lengths [n], prompt_lengths [n] int32; source [n] int32 (index into the
                       manifest's "sources")
                       optional hidden_final [n, max_len, D] and hidden_layers [n, C, max_len, D]
                       (float16): the target's states on the finished sequence, 0 past the length
    manifest.json      written last: a directory without it is never read as complete

Every file is written to a temp name and renamed.
"""

import dataclasses
import functools
import hashlib
import itertools
import json
import os
import re
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from specjax import results, sampling
from specjax.decode import check_prompts, generate
from specjax.models import llama
from specjax.models.config import ModelConfig
from specjax.train import data

PLAN = "plan.json"
# User-message wrappers for the non-chat corpora (chat mode); chitchat is already a chat.
INSTRUCTIONS = {
  "shakespeare": "Continue this passage from Shakespeare:\n\n{text}",
  "kjv": "Continue this passage from the King James Bible:\n\n{text}",
  "python": "Continue this Python code:\n\n{text}",
}
# Task prompts (``tasks=True``): what an assistant is asked to do with a corpus window, so the
# replies are answers, summaries, rewrites and code rather than continuations. Chitchat gives
# a user's question, asked on its own.
TASKS = {
  "shakespeare": (
    "Summarize this passage in two sentences:\n\n{text}",
    "Rewrite this passage in plain modern English:\n\n{text}",
    "Put this passage into the present tense:\n\n{text}",
    "{text}\n\nQuestion: Who is speaking here, and what do they want?",
    "{text}\n\nQuestion: What is this passage about?",
    "List the people and places named in this passage:\n\n{text}",
    "Explain the meaning of this passage to a student:\n\n{text}",
  ),
  "kjv": (
    "Summarize this passage in two sentences:\n\n{text}",
    "Rewrite this passage in plain modern English:\n\n{text}",
    "{text}\n\nQuestion: What happens in this passage?",
    "{text}\n\nQuestion: Which words here would a modern reader not know? Explain them.",
    "List the people and places named in this passage:\n\n{text}",
    "Explain the meaning of this passage to a student:\n\n{text}",
  ),
  "python": (
    "Finish this Python code:\n```python\n{text}",
    "Explain what this Python code does:\n```python\n{text}\n```",
    "Write a docstring for this Python code:\n```python\n{text}\n```",
    "Is there a bug in this Python code? Explain.\n```python\n{text}\n```",
    "Write unit tests for this Python code:\n```python\n{text}\n```",
  ),
}
# Assistant requests (``request_prompts``): what users of a chat model ask it to do on its own,
# with no passage to work from: advice, explanations, stories, plans, letters. Each template's
# slots are filled from its set's slots (``REQUEST_SETS``): the "basic" set's 26 templates
# make 656 distinct requests, the "broad" set's 44 others make 1,169 more, none of them a basic
# one (``all_requests``). The corpora hold no such requests (chitchat is small talk).
REQUEST_TEMPLATES = (
  "Give me {n} tips for {activity}.",
  "What are {n} ways to {goal}?",
  "How do I {task}?",
  "Explain {concept} in simple terms.",
  "Explain {concept} to a ten-year-old.",
  "Write a short story about {character} who {plot}.",
  "Write a short poem about {thing}.",
  "What is the difference between {pair}?",
  "Describe {place} to someone who has never been there.",
  "Write a short email to {person} about {matter}.",
  "What are the benefits of {activity}?",
  "Give me a step-by-step guide to {task_noun}.",
  "Suggest a simple plan for {goal_noun}.",
  "List {n} interesting facts about {thing}.",
  "Write a short product description for {product}.",
  "What should I know before {activity}?",
  "Why is {concept} important?",
  "What are the pros and cons of {activity}?",
  "Write a short speech for {occasion}.",
  "Can you help me {goal}?",
  "What are common mistakes people make when {activity}?",
  "Summarize what you know about {concept} in a few sentences.",
  "Write a friendly message inviting {person} to {event}.",
  "I feel {feeling}. What can I do about it?",
  "Compare {pair} in a short paragraph.",
  "Write a dialogue between {character} and {person}.",
)
REQUEST_SLOTS = {
  "n": ("three", "four", "five"),
  "activity": (
    "learning to cook",
    "running a marathon",
    "starting a vegetable garden",
    "saving money",
    "travelling on a budget",
    "keeping a journal",
    "learning to swim",
    "working from home",
    "public speaking",
    "hiking in the mountains",
    "moving to a new city",
    "adopting a dog",
    "learning the guitar",
    "writing a resume",
    "getting better sleep",
    "reading more books",
    "volunteering",
    "camping with children",
    "learning a second language",
    "baking bread",
  ),
  "goal": (
    "reduce stress",
    "save energy at home",
    "make new friends",
    "stay healthy in winter",
    "improve my handwriting",
    "be more productive in the morning",
    "eat less sugar",
    "keep my room tidy",
    "spend less time on my phone",
    "prepare for a job interview",
    "become a better listener",
    "remember names",
    "drink more water",
    "learn faster",
  ),
  "task": (
    "change a flat tire",
    "plant a tree",
    "write a good cover letter",
    "fold a paper airplane",
    "clean a cast iron pan",
    "set up a budget",
    "boil an egg",
    "tie a tie",
    "back up my computer",
    "start a podcast",
    "paint a room",
    "train a puppy to sit",
    "make pancakes",
    "build a birdhouse",
    "wash a wool sweater",
    "plan a birthday party",
  ),
  "task_noun": (
    "changing a flat tire",
    "planting a tree",
    "making a paper airplane",
    "baking cookies",
    "setting up a fish tank",
    "repotting a plant",
    "making a smoothie",
    "packing for a move",
  ),
  "goal_noun": (
    "learning to code in three months",
    "getting fit at home",
    "a weekend trip to the beach",
    "a quiet family holiday",
    "saving for a bicycle",
    "a school science fair project",
    "a healthy weekly menu",
    "cleaning out the garage",
  ),
  "concept": (
    "gravity",
    "photosynthesis",
    "inflation",
    "the water cycle",
    "democracy",
    "electricity",
    "the internet",
    "vaccines",
    "climate change",
    "compound interest",
    "recycling",
    "the immune system",
    "black holes",
    "renewable energy",
    "supply and demand",
    "evolution",
    "machine learning",
    "the seasons",
    "volcanoes",
    "friendship",
  ),
  "character": (
    "a lonely lighthouse keeper",
    "a curious cat",
    "a young wizard",
    "an old fisherman",
    "a shy dragon",
    "a brave little mouse",
    "a time traveller",
    "a girl from a mountain village",
    "a lost astronaut",
    "a talking tree",
  ),
  "plot": (
    "finds a secret door",
    "makes an unlikely friend",
    "loses something precious",
    "has to cross a desert",
    "discovers a hidden talent",
    "solves a mystery in town",
    "gets lost in a big city",
    "builds a boat",
  ),
  "thing": (
    "the ocean",
    "autumn leaves",
    "the moon",
    "honeybees",
    "mountains",
    "rain",
    "elephants",
    "the night sky",
    "coffee",
    "old books",
    "trains",
    "snow",
    "the desert",
    "owls",
  ),
  "pair": (
    "weather and climate",
    "a virus and a bacterium",
    "a lake and a pond",
    "cats and dogs",
    "renting and buying a home",
    "a crocodile and an alligator",
    "baking and roasting",
    "speed and velocity",
    "a simile and a metaphor",
    "weight and mass",
  ),
  "place": (
    "a busy market",
    "a rainforest",
    "a small island",
    "a library at night",
    "the Arctic",
    "a farm in spring",
    "an old castle",
    "a train station at rush hour",
  ),
  "person": (
    "my manager",
    "a friend",
    "my neighbour",
    "a teacher",
    "my landlord",
    "a new colleague",
    "my grandmother",
    "the team",
  ),
  "matter": (
    "a delayed project",
    "a missed meeting",
    "a noisy party next door",
    "a broken heater",
    "next week's holiday",
    "a thank-you for their help",
    "a change of plans",
  ),
  "product": (
    "a reusable water bottle",
    "a pair of running shoes",
    "a desk lamp",
    "a backpack",
    "a wooden chess set",
    "a smart watch",
    "a houseplant kit",
  ),
  "occasion": (
    "a friend's wedding",
    "a retirement party",
    "the first day of school",
    "a team's victory",
    "a graduation",
  ),
  "event": ("a picnic", "a board game night", "a birthday dinner", "a walk in the park"),
  "feeling": ("tired all the time", "nervous about an exam", "bored at work", "a bit lonely"),
}
# The "broad" set: mostly other kinds of request (recipes, trips, rules, how things work,
# history, plans, notes, jokes; some tips, poems and stories again) on other topics. Nothing
# here asks for book picks, names for a business, a card, questions to ask, or why an everyday
# thing happens, and no request names a topic of a held-out chat prompt (tea, books, cars,
# birthdays, bakeries, shops...: a test checks): those stay held out for measuring (the EAGLE
# experiment's CHAT_NEW and training_free's chat prompts).
BROAD_TEMPLATES = (
  "Write a haiku about {season}.",
  "Write a limerick about {animal}.",
  "Tell me a joke about {animal}.",
  "What is a simple recipe for {dish}?",
  "How does {device} work?",
  "What happened during {history}?",
  "Who was {figure}, and why are they remembered?",
  "Plan a {days}-day trip to {city}.",
  "What are the best things to see in {city}?",
  "Write a thank-you note to {relative} for {gift}.",
  "Give me a {days}-day workout plan for {fitness}.",
  "What are some fun things to do {setting}?",
  "How can I get better at {skill}?",
  "What does {job} do in a typical day?",
  "Write the opening lines of a cover letter for a job as {job}.",
  "Explain the rules of {game}.",
  "Give me {n} ideas for {project}.",
  "What are the main causes of {problem}?",
  "How can a city reduce {problem}?",
  "Write an encouraging message for someone who is {situation}.",
  "What would happen if {hypothetical}?",
  "Describe a day in the life of {animal} in the wild.",
  "Help me write an apology to {relative} for {mistake}.",
  "Write a short blog post about {hobby}.",
  "Make a packing list for {trip}.",
  "Write the first paragraph of {genre} story set in {setting_place}.",
  "Write a short poem about how {nature}.",
  "Summarize the story of {tale}.",
  "Give me advice on {life_matter}.",
  "Create a weekly schedule for {schedule}.",
  "What should I eat {meal_time}?",
  "Teach me the basics of {hobby}.",
  "What is the history of {invention}?",
  "Write a short news report about {local_news}.",
  "How should I prepare for {milestone}?",
  "Write a short conversation in which {relative} explains {device} to a child.",
  "Write a short poem about {animal} {setting}.",
  "Explain how {device} works to {learner}.",
  "Write a recipe for {dish} that {diet}.",
  "Write {genre} story about {animal}.",
  "Write a short story about {animal} that lives in {setting_place}.",
  "Describe {invention} as if you were {figure}.",
  "Write a short dialogue between {job} and {animal}.",
  "Give me {n} tips for getting better at {skill}.",
)
BROAD_SLOTS = {
  "n": ("three", "four", "five", "six"),
  "season": (
    "early spring",
    "a summer storm",
    "the first frost",
    "a harvest moon",
    "falling snow",
    "cherry blossoms",
    "a foggy morning",
    "a hot afternoon",
  ),
  "animal": (
    "a penguin",
    "a giraffe",
    "an octopus",
    "a hedgehog",
    "a parrot",
    "a goldfish",
    "a fox",
    "a kangaroo",
    "a snail",
    "a wolf",
    "a dolphin",
    "a tortoise",
  ),
  "dish": (
    "vegetable soup",
    "banana bread",
    "fried rice",
    "a tomato pasta sauce",
    "guacamole",
    "lentil curry",
    "oatmeal cookies",
    "a Greek salad",
    "scrambled eggs",
    "hummus",
    "lemonade",
    "potato salad",
  ),
  "device": (
    "a refrigerator",
    "a microwave oven",
    "a solar panel",
    "a bicycle gear",
    "a compass",
    "a thermostat",
    "a camera",
    "an electric motor",
    "a GPS receiver",
    "a smoke detector",
    "a touch screen",
    "a washing machine",
  ),
  "history": (
    "the building of the pyramids",
    "the Industrial Revolution",
    "the first moon landing",
    "the fall of the Roman Empire",
    "the invention of the printing press",
    "the California gold rush",
    "the age of exploration",
    "the Renaissance",
  ),
  "figure": (
    "Marie Curie",
    "Leonardo da Vinci",
    "Isaac Newton",
    "Ada Lovelace",
    "Nelson Mandela",
    "Galileo Galilei",
    "Florence Nightingale",
    "Charles Darwin",
    "Cleopatra",
    "Albert Einstein",
  ),
  "days": ("two", "three", "five"),
  "learner": ("a child", "my grandmother", "a complete beginner", "an engineer"),
  "diet": (
    "is vegetarian",
    "a beginner can make",
    "takes under thirty minutes",
    "feeds six people",
  ),
  "city": (
    "Paris",
    "Tokyo",
    "Rome",
    "New York",
    "Barcelona",
    "Cairo",
    "Sydney",
    "Lisbon",
    "Mexico City",
    "Istanbul",
  ),
  "relative": (
    "my aunt",
    "my uncle",
    "my sister",
    "my best friend",
    "my cousin",
    "my mother",
    "my father",
    "my roommate",
  ),
  "gift": (
    "a handmade scarf",
    "a cookbook",
    "a weekend visit",
    "helping me move",
    "a lovely dinner",
    "looking after my cat",
  ),
  "fitness": (
    "a beginner",
    "building strength",
    "improving stamina",
    "a busy parent",
    "someone with no equipment",
  ),
  "setting": (
    "on a rainy day",
    "in a small town",
    "with friends in the evening",
    "on a winter weekend",
    "with young children",
    "without spending money",
    "at the beach",
    "on a long train journey",
  ),
  "skill": (
    "chess",
    "drawing",
    "typing",
    "negotiating",
    "photography",
    "juggling",
    "mental arithmetic",
    "writing clearly",
    "singing",
    "public transport planning",
  ),
  "job": (
    "a nurse",
    "an architect",
    "a software engineer",
    "a librarian",
    "a pilot",
    "a farmer",
    "a chef",
    "an electrician",
    "a park ranger",
    "a journalist",
  ),
  "game": (
    "chess",
    "basketball",
    "volleyball",
    "tennis",
    "poker",
    "checkers",
    "cricket",
    "Monopoly",
    "hide and seek",
    "football",
  ),
  "project": (
    "a rainy weekend",
    "a school art project",
    "a family reunion",
    "decorating a small bedroom",
    "a science experiment at home",
    "a community clean-up day",
    "a short film",
    "reusing old jars",
    "a garden party",
    "a neighbourhood newsletter",
  ),
  "problem": (
    "traffic jams",
    "air pollution",
    "food waste",
    "noise",
    "litter in parks",
    "water shortages",
    "loneliness among older people",
    "high rents",
  ),
  "situation": (
    "starting a new job",
    "training for a race",
    "learning to drive",
    "recovering from an illness",
    "training for a big race",
    "moving abroad",
    "looking for work",
    "learning to play the piano",
  ),
  "hypothetical": (
    "the moon disappeared",
    "everyone could read minds",
    "it never rained again",
    "boats could fly",
    "humans could breathe underwater",
    "the internet stopped working for a week",
    "animals could talk",
    "there were no clocks",
  ),
  "mistake": (
    "missing their party",
    "forgetting to call",
    "breaking their favourite mug",
    "being late",
    "losing a borrowed jacket",
  ),
  "hobby": (
    "bird watching",
    "knitting",
    "rock climbing",
    "pottery",
    "beekeeping",
    "stargazing",
    "woodworking",
    "origami",
    "cycling to work",
    "growing herbs indoors",
  ),
  "trip": (
    "a week of camping",
    "a business trip",
    "a ski holiday",
    "a beach weekend",
    "a long flight",
    "a hospital stay",
    "a music festival",
  ),
  "genre": ("a pirate", "a science fiction", "a fantasy", "an adventure", "a ghost", "a comedy"),
  "setting_place": (
    "a floating city",
    "a quiet fishing village",
    "an abandoned space station",
    "a school in the clouds",
    "a desert oasis",
    "a busy hospital",
  ),
  "nature": (
    "bees make honey",
    "birds find their way south",
    "plants drink water",
    "whales talk to each other",
    "earthquakes start",
    "rainbows form",
    "caterpillars become butterflies",
    "tides work",
    "glaciers move",
    "bats see in the dark",
    "seeds know which way is up",
    "lightning strikes",
  ),
  "tale": (
    "Cinderella",
    "Romeo and Juliet",
    "the tortoise and the hare",
    "Robin Hood",
    "Jack and the Beanstalk",
    "the Odyssey",
    "Snow White",
    "the boy who cried wolf",
  ),
  "life_matter": (
    "asking for a raise",
    "sharing a flat",
    "saying no politely",
    "keeping in touch with old friends",
    "choosing a university",
    "changing careers",
    "dealing with a difficult coworker",
    "planning a wedding on a budget",
    "settling into retirement",
  ),
  "schedule": (
    "a student with exams",
    "learning a language",
    "a family with two children",
    "training for a half marathon",
    "learning to draw",
    "a remote worker",
  ),
  "meal_time": (
    "before a long run",
    "for a quick breakfast",
    "when I have a cold",
    "for lunch at work",
    "after a workout",
    "late at night",
  ),
  "invention": (
    "the telephone",
    "the bicycle",
    "paper money",
    "the light bulb",
    "the wheel",
    "the calendar",
    "chocolate",
    "the airplane",
    "glass",
    "the map",
  ),
  "local_news": (
    "a town festival",
    "a new park opening",
    "a lost dog found by children",
    "a school winning a robotics contest",
    "a storm that knocked out power",
    "a library turning one hundred",
  ),
  "milestone": (
    "my first marathon",
    "a piano recital",
    "becoming a parent",
    "a driving test",
    "a long hike",
    "my first day at university",
    "a public speech",
    "a move abroad",
  ),
}
REQUEST_SETS = {
  "basic": (REQUEST_TEMPLATES, REQUEST_SLOTS),
  "broad": (BROAD_TEMPLATES, BROAD_SLOTS),
}
_MIN_QUESTION_WORDS = 4  # a chitchat question shorter than this is a greeting, not a task
_TURN_MARKUP_TOKENS = 5  # ChatML's "<|im_start|>role\n ... <|im_end|>\n" around each turn.
_WINDOW_CHARS_PER_TOKEN = 8  # Characters read per wanted token: enough for any corpus here.


@dataclasses.dataclass(frozen=True)
class Prompts:
  ids: list[list[int]]  # token ids, ready for generate
  sources: list[str]  # the corpus each prompt was cut from
  texts: list[str]  # the prompt text as the tokenizer saw it


def corpus_prompts(
  sources: Sequence[str],
  tokenizer,
  *,
  num_prompts: int,
  min_tokens: int,
  max_tokens: int,
  seed: int = 0,
  chat: bool = True,
  tasks: bool = False,
) -> Prompts:
  """``num_prompts`` prompts, round-robin over the corpora ``sources``; deterministic in seed.

  Lengths count the corpus text (chat mode adds the template and the instruction around it).
  ``tasks``: each window is wrapped in one of its corpus's ``TASKS`` (drawn per prompt), and
  chitchat gives one user question (at least ``_MIN_QUESTION_WORDS`` words, at most
  ``max_tokens`` tokens), whole, instead of a conversation.
  """
  if not sources:
    raise ValueError(
      "sources is empty: name at least one corpus (" + ", ".join(data.CORPORA) + ")."
    )
  for s in sources:
    data.corpus_path(s)  # Unknown or missing corpora fail here, before any reading.
  if num_prompts < 1:
    raise ValueError(f"num_prompts must be >= 1, got {num_prompts}.")
  if not 1 <= min_tokens <= max_tokens:
    raise ValueError(
      f"prompt lengths need 1 <= min_tokens <= max_tokens, got {min_tokens} and {max_tokens}."
    )
  if chat and getattr(tokenizer, "apply_chat_template", None) is None:
    raise ValueError("chat=True needs a tokenizer with a chat template; set chat=False.")
  if tasks and not chat:
    raise ValueError("tasks=True writes user messages: it needs chat=True.")
  makers = {s: _PromptMaker(s, tokenizer, seed, min_tokens, max_tokens, chat, tasks)
            for s in sources}  # fmt: skip
  out = Prompts([], [], [])
  for i in range(num_prompts):
    source = sources[i % len(sources)]
    text = makers[source].next()
    out.ids.append(list(tokenizer.encode(text)))
    out.sources.append(source)
    out.texts.append(text)
  return out


class _PromptMaker:
  """Cuts prompts from one corpus: documents in a seeded order, cycled."""

  def __init__(self, name, tokenizer, seed, lo, hi, chat, tasks=False):
    self.name, self.tok, self.lo, self.hi, self.chat = name, tokenizer, lo, hi, chat
    self.tasks = tasks
    self.rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name == "chitchat" and tasks:
      self.docs = _questions(data.chat_conversations())
    elif name == "chitchat" and chat:
      self.docs = list(data.chat_conversations())
    else:
      template = getattr(tokenizer, "apply_chat_template", None)
      render = (lambda m: template(m, add_generation_prompt=False)) if template else None
      self.docs = list(data.corpus_documents(name, chat_template=render))
    self.order = self.rng.permutation(len(self.docs))
    self.i = 0

  def next(self) -> str:
    for _ in range(len(self.docs)):
      doc = self.docs[self.order[self.i % len(self.docs)]]
      self.i += 1
      if self.name == "chitchat" and self.tasks:  # a question of at most hi tokens, whole
        if len(data.encode_batch(self.tok, [doc])[0]) <= self.hi:
          return self.tok.apply_chat_template([{"role": "user", "content": doc}])
        continue
      n = int(self.rng.integers(self.lo, self.hi + 1))
      text = self._conversation(doc, n) if isinstance(doc, list) else self._window(doc, n)
      if text is not None:
        return text
    raise ValueError(
      f"corpus {self.name!r} has no document of >= {self.lo} tokens: lower min_tokens."
    )

  def _window(self, doc: str, n: int) -> str | None:
    start = int(self.rng.integers(0, len(doc)))
    start = doc.find("\n", start) + 1  # From a line start; 0 if no newline follows.
    window = doc[start : start + _WINDOW_CHARS_PER_TOKEN * n].lstrip("\n")
    ids = data.encode_batch(self.tok, [window])[0]
    if len(ids) < self.lo:
      ids = data.encode_batch(self.tok, [doc[: _WINDOW_CHARS_PER_TOKEN * n]])[0]
      if len(ids) < self.lo:
        return None
    text = self.tok.decode(ids[:n])
    if not self.chat:
      return text
    if self.tasks:  # drawn only here, so plain prompts keep their seeded stream
      wrapper = TASKS[self.name][int(self.rng.integers(len(TASKS[self.name])))]
    else:
      wrapper = INSTRUCTIONS[self.name]
    user = wrapper.format(text=text)
    return self.tok.apply_chat_template([{"role": "user", "content": user}])

  def _conversation(self, turns: list[dict], n: int) -> str:
    """Turns from a random start (relabelled to begin with the user) within ``n`` tokens,
    counting each turn's ChatML markup; a first turn longer than that is cut."""
    start = int(self.rng.integers(0, len(turns)))
    messages, used = [], 0
    for j, turn in enumerate(turns[start:]):
      ids = data.encode_batch(self.tok, [turn["content"]])[0]
      cost = len(ids) + _TURN_MARKUP_TOKENS
      if messages and used + cost > n:
        break
      content = turn["content"] if len(ids) <= n else self.tok.decode(ids[:n])
      messages.append({"role": ("user", "assistant")[j % 2], "content": content})
      used += cost
    if messages[-1]["role"] == "assistant":
      messages.pop()  # The target answers a user turn.
    return self.tok.apply_chat_template(messages)


def _questions(conversations) -> list[str]:
  """Every distinct turn of the conversations that ends in a question mark and has at least
  ``_MIN_QUESTION_WORDS`` words, in first-seen order."""
  seen = {}
  for turns in conversations:
    for turn in turns:
      text = turn["content"].strip()
      if text.endswith("?") and len(text.split()) >= _MIN_QUESTION_WORDS:
        seen.setdefault(text, None)
  return list(seen)


def _slots(template: str) -> list[str]:
  """The slot names of a request template, in order."""
  return re.findall(r"{(\w+)}", template)


def request_set(name: str) -> tuple[tuple[str, ...], dict]:
  """The templates and slots of the request set ``name`` (a key of ``REQUEST_SETS``)."""
  if name not in REQUEST_SETS:
    raise ValueError(f"request set {name!r} is not one of {', '.join(REQUEST_SETS)}.")
  return REQUEST_SETS[name]


def all_requests(name: str = "basic") -> set[str]:
  """Every request the set's templates make: each template with every combination of its
  slots."""
  templates, slots = request_set(name)
  out = set()
  for template in templates:
    keys = _slots(template)
    for values in itertools.product(*(slots[k] for k in keys)):
      out.add(template.format(**dict(zip(keys, values, strict=True))))
  return out


def request_prompts(tokenizer, *, num_prompts: int, seed: int = 0, name: str = "basic") -> Prompts:
  """``num_prompts`` distinct assistant requests (the templates of request set ``name`` with
  their slots filled at random), chat-templated; deterministic in seed. Their source is
  ``"requests"``."""
  templates, slot_values = request_set(name)
  distinct = len(all_requests(name))
  if not 1 <= num_prompts <= distinct:
    raise ValueError(
      f"num_prompts={num_prompts}: the {name!r} templates make {distinct} distinct requests; "
      f"ask for 1 to {distinct}, or use a larger set of REQUEST_SETS."
    )
  if getattr(tokenizer, "apply_chat_template", None) is None:
    raise ValueError(
      "request prompts are user messages: they need a tokenizer with a chat template."
    )
  rng = np.random.default_rng([seed, zlib.crc32(b"requests")])
  slots = [_slots(t) for t in templates]
  out, seen = Prompts([], [], []), set()
  while len(out.ids) < num_prompts:  # Templates drawn uniformly, then their slots.
    i = int(rng.integers(len(templates)))
    fill = {k: slot_values[k][int(rng.integers(len(slot_values[k])))] for k in slots[i]}
    request = templates[i].format(**fill)
    if request in seen:
      continue
    seen.add(request)
    text = tokenizer.apply_chat_template([{"role": "user", "content": request}])
    out.ids.append(list(tokenizer.encode(text)))
    out.sources.append("requests")
    out.texts.append(text)
  return out


# -- generation -----------------------------------------------------------------------------------


def self_distill(
  params,
  cfg: ModelConfig,
  prompts: Sequence[Sequence[int]],
  out_dir,
  *,
  max_new_tokens: int,
  max_len: int,
  batch_size: int,
  shard_size: int,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
  seed: int = 0,
  eos_id=None,
  sources: Sequence[str] | None = None,
  capture_layers: Sequence[int] = (),
  capture_final: bool = False,
  tokenizer_fingerprint: str | None = None,
  metadata: dict | None = None,
  progress: bool = True,
) -> dict:
  """Generates the target's continuations of ``prompts`` into shards under ``out_dir``.

  Returns the manifest. Everything is checked before anything is compiled; an unfinished
  directory with the same plan is resumed, any other existing content is refused.
  """
  out_dir = Path(out_dir)
  prompts = [list(map(int, p)) for p in prompts]
  capture_layers = tuple(int(i) for i in capture_layers)
  sources = list(sources) if sources is not None else ["prompts"] * len(prompts)
  _check(cfg, prompts, sources, max_new_tokens, max_len, batch_size, shard_size, capture_layers)
  sampling.validate(temperature, top_k, top_p)
  names = sorted(set(sources))
  eos_id = None if eos_id is None else int(eos_id) if isinstance(eos_id, int) else sorted(eos_id)
  settings = {
    "model": cfg.name,
    "tokenizer_fingerprint": tokenizer_fingerprint,
    "max_new_tokens": max_new_tokens,
    "max_len": max_len,
    "batch_size": batch_size,
    "shard_size": shard_size,
    "temperature": float(temperature),
    "top_k": top_k,
    "top_p": float(top_p),
    "seed": seed,
    "eos_id": eos_id,
    "capture_layers": list(capture_layers),
    "capture_final": capture_final,
  }
  digest = hashlib.sha256(json.dumps([prompts, sources, settings]).encode()).hexdigest()
  shard_files = _start(out_dir, {"digest": digest, "num_examples": len(prompts), **settings})

  keys = ("max_new_tokens", "max_len", "temperature", "top_k", "top_p", "eos_id")
  gen_kwargs = {k: settings[k] for k in keys}
  shards, new_tokens, seconds, resumed, batch_seconds = [], 0, 0.0, 0, []
  bar = tqdm(total=len(prompts), unit="ex", desc=f"self-distill -> {out_dir}", disable=not progress)
  for s, path in enumerate(shard_files):
    lo = s * shard_size
    rows = prompts[lo : lo + shard_size]
    shards.append({"file": path.name, "examples": len(rows)})
    if path.is_file():  # Finished by an earlier run with the same plan, unless damaged.
      damage = shard_damage(path, len(rows))
      if damage is None:
        resumed += 1
        bar.update(len(rows))
        continue
      tqdm.write(f"{path} is damaged ({damage}): generating it again")
      path.unlink()
    t0 = time.perf_counter()
    continuations = []
    for j in range(0, len(rows), batch_size):
      batch = rows[j : j + batch_size]
      padded = batch + [batch[i % len(batch)] for i in range(batch_size - len(batch))]
      tb = time.perf_counter()
      out = generate(params, cfg, padded, seed=seed + (lo + j) // batch_size, **gen_kwargs)
      batch_seconds.append(time.perf_counter() - tb)
      continuations += out.tokens[: len(batch)]
      new_tokens += sum(len(c) for c in out.tokens[: len(batch)])
      bar.update(len(batch))
      bar.set_postfix(tok_s=f"{new_tokens / (seconds + time.perf_counter() - t0):.0f}")
    arrays = _examples(rows, continuations, max_len)
    arrays["source"] = np.array([names.index(x) for x in sources[lo : lo + len(rows)]], np.int32)
    if capture_final or capture_layers:
      arrays |= _hidden_states(params, cfg, arrays, capture_layers, capture_final, batch_size)
    _save_npz(path, arrays)
    seconds += time.perf_counter() - t0
  bar.close()

  manifest = {
    "format": data.SHARD_FORMAT,
    **settings,
    "num_examples": len(prompts),
    "sources": names,
    "shards": shards,
    # The target's fingerprint: training checks it (another vocabulary or tokenizer is refused).
    "target": {
      "name": cfg.name,
      "vocab_size": cfg.vocab_size,
      "tokenizer_fingerprint": tokenizer_fingerprint,
    },
    "hidden": {
      "final": capture_final,
      "layers": list(capture_layers),
      "dim": cfg.dim,
      "dtype": "float16",
    },
    "stats": {
      "new_tokens_this_run": new_tokens,
      "seconds_this_run": seconds,
      "tokens_per_s": new_tokens / seconds if seconds else None,
      "shards_resumed": resumed,
      "batch_seconds": batch_seconds,  # the first includes compilation
    },
    "metadata": metadata or {},
  }
  results.write_json(out_dir / data.MANIFEST, manifest)
  return manifest


def _check(cfg, prompts, sources, max_new_tokens, max_len, batch_size, shard_size, capture_layers):
  if not prompts:
    raise ValueError("prompts is empty: give at least one prompt (a list of token ids).")
  if len(sources) != len(prompts):
    raise ValueError(f"sources has {len(sources)} labels for {len(prompts)} prompts.")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  if shard_size < 1 or shard_size % batch_size:
    raise ValueError(
      f"shard_size={shard_size} must be a positive multiple of batch_size={batch_size}."
    )
  check_prompts(prompts, [max_new_tokens] * len(prompts), max_len, cfg.vocab_size)
  bad = [i for i in capture_layers if not 0 <= i < cfg.num_layers]
  if bad:
    raise ValueError(f"capture_layers {bad} are outside [0, {cfg.num_layers}) for {cfg.name!r}.")


def _start(out_dir: Path, plan: dict) -> list[Path]:
  """Checks ``out_dir`` and writes the plan; returns the shard paths."""
  if (out_dir / data.MANIFEST).exists():
    raise ValueError(
      f"{out_dir} already holds a finished self-distillation ({data.MANIFEST}); choose another "
      "output directory or delete it."
    )
  n = -(-plan["num_examples"] // plan["shard_size"])
  files = [out_dir / f"shard-{i:05d}.npz" for i in range(n)]
  plan_path = out_dir / PLAN
  if plan_path.is_file():
    if json.loads(plan_path.read_text()) != plan:
      raise ValueError(
        f"{out_dir} holds an unfinished self-distillation with other prompts or settings; "
        "delete it or choose another output directory."
      )
    for tmp in out_dir.glob(".shard-*.tmp"):  # Left by an interrupted write.
      tmp.unlink()
  elif out_dir.exists() and any(out_dir.iterdir()):
    raise ValueError(f"{out_dir} is not empty; choose a new or empty output directory.")
  else:
    results.write_json(plan_path, plan)
  return files


def _examples(prompts, continuations, max_len) -> dict[str, np.ndarray]:
  n = len(prompts)
  tokens = np.zeros((n, max_len), np.int32)
  mask = np.zeros((n, max_len), np.float32)
  lengths = np.zeros(n, np.int32)
  prompt_lengths = np.zeros(n, np.int32)
  for r, (p, c) in enumerate(zip(prompts, continuations, strict=True)):
    seq = p + c
    tokens[r, : len(seq)] = seq
    mask[r, len(p) - 1 : len(seq) - 1] = 1.0  # Positions whose next token was generated.
    lengths[r], prompt_lengths[r] = len(seq), len(p)
  return {"tokens": tokens, "mask": mask, "lengths": lengths, "prompt_lengths": prompt_lengths}


@functools.partial(jax.jit, static_argnames=("cfg", "capture_layers"))
def _forward_hidden(params, tokens_BxS, *, cfg, capture_layers):
  # The logits are unused, so XLA drops the LM head.
  _, (final, *layers) = llama.logits_of(params, cfg, tokens_BxS, (llama.FINAL, *capture_layers))
  return final.astype(jnp.float16), tuple(h.astype(jnp.float16) for h in layers)


def _hidden_states(params, cfg, arrays, capture_layers, capture_final, batch_size):
  """Teacher-forced target states over each finished sequence, 0 past its length."""
  tokens = arrays["tokens"]
  n, s = tokens.shape
  finals, layers = [], []
  for i in range(0, n, batch_size):
    chunk = tokens[i : i + batch_size]
    padded = np.concatenate([chunk, np.zeros((batch_size - len(chunk), s), np.int32)])
    final, per_layer = _forward_hidden(params, padded, cfg=cfg, capture_layers=capture_layers)
    finals.append(np.asarray(final)[: len(chunk)])
    if capture_layers:
      layers.append(np.stack([np.asarray(h)[: len(chunk)] for h in per_layer], axis=1))
  valid_NxS = np.arange(s)[None, :] < arrays["lengths"][:, None]
  out = {}
  if capture_final:
    out["hidden_final"] = np.where(valid_NxS[..., None], np.concatenate(finals), 0)
  if capture_layers:
    out["hidden_layers"] = np.where(valid_NxS[:, None, :, None], np.concatenate(layers), 0)
  return {k: v.astype(np.float16) for k, v in out.items()}


def shard_damage(path: Path, examples: int) -> str | None:
  """Why a finished shard cannot be trusted (unreadable, or not ``examples`` rows), or None.
  Reads every array, so a zip member whose data was damaged fails its CRC here."""
  try:
    with np.load(path) as f:
      arrays = {k: f[k] for k in f.files}
  except Exception as e:  # BadZipFile, EOFError, zlib/CRC errors, ...
    return f"{type(e).__name__}: {e}"
  if "tokens" not in arrays or len(arrays["tokens"]) != examples:
    return f"it holds {len(arrays.get('tokens', ()))} examples, not {examples}"
  return None


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
  """``np.savez`` to a temp file in the same directory, synced to disk, then an atomic rename
  (a crash never leaves a renamed shard whose data is still in the page cache only)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **arrays)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
