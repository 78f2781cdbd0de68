"""Chat instructions the target answers for self-distillation: task templates (explain,
summarise, rewrite, list, compare, write, how-to, Python code, maths, advice, reasoning, facts)
filled with topic lists and short paragraphs written for this project, so a drafter learns the
target's own chat distribution. None repeats a prompt of the benchmark's chat workload
(bench/prompts/chat.jsonl), which stays held out for evaluation; all is deterministic.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from verispec.types.chat import chat_prompt

SPLITS = ("train", "heldout")
NUM_HELDOUT = 64

Fill = str | tuple[str, ...]
"""What fills a template's {} slots: one text, or a tuple of texts for several slots."""
Family = tuple[tuple[str, ...], str, int]
"""(templates with {} slots, the name of their fills in topics(), templates used per fill)."""
TOPICS_FILE = "data/instructions.json"
"""The topics, texts and code the instructions are built from (in verispec.train), all written
for this project. Invented names and subjects of the benchmark's chat workload are deliberately
absent, so that workload stays a clean held-out evaluation."""

FAMILIES: tuple[Family, ...] = (
    (("Explain {} in simple terms.", "What is {}, and why does it matter?",
      "Give me a short explanation of {}.", "I've never really understood {}. Can you explain it "
      "with an everyday example?", "Explain {} as if I were a complete beginner."), "concepts", 4),
    (("What does '{}' mean?", "Define '{}' and use it in a sentence.",
      "What is the meaning of the word {}? Give an example."), "terms", 2),
    (("List {} {}.", "Give me {} {}.", "What are {} {}?"), "lists", 3),
    (("What is the difference between {} and {}?", "Compare {} and {} in a short table.",
      "What are the pros and cons of {} versus {}?"), "compare", 2),
    (("Write a short story about {}.", "Tell me a bedtime story about {}.",
      "Write a story of about 100 words about {}.",
      "Write the opening paragraph of a novel about {}."), "stories", 2),
    (("Write a poem about {}.", "Write a haiku about {}.", "Write a limerick about {}.",
      "Write a short rhyming poem about {}."), "poems", 2),
    (("Write an email {}.", "Help me write a short, polite email {}.",
      "Draft a friendly message {}."), "emails", 2),
    (("How do I {}?", "What's the best way to {}?",
      "Can you give me step-by-step instructions to {}?", "I want to {}. Where do I start?"),
     "how_to", 3),
    (("Write a Python function that {}.", "How would I write a function in Python that {}?",
      "Can you write me a Python function that {}? Please include a docstring.",
      "I need a python function which {}. Add a couple of example calls.",
      "Write a Python function that {}, and explain how it works."), "functions", 3),
    (("What does this Python code do?\n\n```python\n{}\n```",
      "Explain this code line by line:\n\n{}",
      "Can you walk me through what happens when this runs?\n\n{}"), "snippets", 2),
    (("This function should {}, but it doesn't work. What's wrong?\n\n```python\n{}\n```",
      "Fix the bug in this Python code. It is supposed to {}.\n\n{}"), "bugs", 2),
    (("{}. Any advice?", "{}. What should I do?", "Can you give me some tips? {}.",
      "I need some advice. {}. How should I handle it?"), "advice", 3),
    (("{}", "{} Answer in one sentence.", "{} Please explain briefly."), "facts", 2),
    (("Summarise the following paragraph in one sentence.\n\n{}",
      "Can you give me a short summary of this?\n\n{}", "TL;DR this for me:\n\n{}",
      "What is the main point of this paragraph?\n\n{}",
      "Summarise this in three bullet points:\n\n{}",
      "{}\n\nSummarise the text above in under 30 words.",
      "Write a one-line headline for this text.\n\n{}",
      "Pull out the key facts from this paragraph as a short list.\n\n{}"), "paragraphs", 8),
    (("Rewrite this paragraph in a more formal tone.\n\n{}",
      "Make this text more casual and friendly:\n\n{}",
      "Rewrite the following so that a young reader can follow it.\n\n{}",
      "Shorten this paragraph to about half its length without losing the main facts.\n\n{}",
      "Translate this paragraph into French.\n\n{}", "Translate the following text into Spanish:"
      "\n\n{}", "Rewrite this text as a short social media post.\n\n{}",
      "Improve the flow of this paragraph and fix any awkward sentences:\n\n{}",
      "Turn this paragraph into a short dialogue between two people.\n\n{}",
      "Write three questions a teacher could ask to check that a student understood this text."
      "\n\n{}", "{}\n\nRewrite the text above in the first person."), "paragraphs", 11),
)  # fmt: skip

SUFFIXES = (" Keep it brief.", " Please be concise.", " Use simple words.", " Thanks!",
            " I'm new to this, so go slowly.")  # fmt: skip
PREFIXES = ("Quick question. ", "Hi! ", "Hey! ", "Hello. ")


def chat_instructions(split: str) -> list[str]:
    """The user instructions of a split: "train" (over 2000) or "heldout" (64, none in train).

    Held-out ones are spread evenly over the full ordered set, so they cover every task kind.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    everything = all_instructions()
    step = len(everything) / NUM_HELDOUT
    picked = {int(step * (k + 0.5)) for k in range(NUM_HELDOUT)}
    return [x for i, x in enumerate(everything) if (i in picked) == (split == "heldout")]


def all_instructions() -> list[str]:
    """Every instruction once, in a fixed order: the template families, proofreading, maths
    and reasoning, each short one possibly given a casual prefix or suffix (see styled)."""
    data = topics()
    raw = [text for templates, name, per_fill in FAMILIES
           for text in fill(templates, data[name], per_fill)]  # fmt: skip
    raw += [f"Correct the spelling mistakes in this paragraph:\n\n{with_typos(str(p))}"
            for p in data["paragraphs"]]  # fmt: skip
    raw += [make(i) for make in MATH + REASONING for i in range(15)]
    return list(dict.fromkeys(styled(text, i) for i, text in enumerate(raw)))


@functools.cache
def topics() -> dict[str, tuple[Fill, ...]]:
    """The fills of each family by name, read from TOPICS_FILE (a pair or a (count, subject)
    there is a list, here a tuple); read once, the tuples are never changed."""
    text = resources.files("verispec.train").joinpath(TOPICS_FILE).read_text(encoding="utf-8")
    return {name: tuple(tuple(x) if isinstance(x, list) else x for x in fills)
            for name, fills in json.loads(text).items()}  # fmt: skip


def fill(templates: Sequence[str], fills: Sequence[Fill], per_fill: int) -> list[str]:
    """Each fill in per_fill templates, rotating so that neighbouring fills start elsewhere.

    >>> fill(("A {}.", "B {}."), ["x", "y"], 1)
    ['A x.', 'B y.']
    """
    out = []
    for j, item in enumerate(fills):
        args = item if isinstance(item, tuple) else (item,)
        out += [templates[(j + r) % len(templates)].format(*args) for r in range(per_fill)]
    return out


def styled(text: str, i: int) -> str:
    """Some one-line instructions as users type them: lower-case start without the final full
    stop, a greeting first, or an extra wish at the end (chosen by the index i, not randomly).

    >>> styled("List three birds.", 5), styled("List three birds.", 7)
    ('list three birds', 'List three birds. Keep it brief.')
    """
    if "\n" in text:
        return text
    kind = i % 11
    if kind == 5:
        return text[0].lower() + text[1:].removesuffix(".")
    if kind in (7, 9):
        return text + SUFFIXES[(i // 11) % len(SUFFIXES)]
    if kind == 2:
        return PREFIXES[(i // 11) % len(PREFIXES)] + text
    return text


def with_typos(text: str, every: int = 6) -> str:
    """text with its 4th and 5th letters swapped in every `every`-th word longer than five letters.

    >>> with_typos("Several strange animals wandered through quiet gardens", every=2)
    'Several strnage animals wanedred through quiet garedns'
    """
    words = text.split(" ")
    long_words = [i for i, w in enumerate(words) if len(w) > 5 and w.isalpha()]
    for n, i in enumerate(long_words):
        if n % every == every - 1:
            w = words[i]
            words[i] = w[:3] + w[4] + w[3] + w[5:]
    return " ".join(words)


def _n(i: int, k: int, low: int, high: int) -> int:
    """A number in [low, high] that varies with i and k without repeating quickly."""
    return low + (i * (2 * k + 7) + 3 * k * k) % (high - low + 1)


MATH: tuple[Callable[[int], str], ...] = (
    lambda i: f"A shop sells notebooks for ${_n(i, 1, 2, 9)} each. How much do "
    f"{_n(i, 2, 3, 24)} notebooks cost?",
    lambda i: f"A train travels {_n(i, 1, 6, 30) * 10} km in {_n(i, 2, 2, 5)} hours. "
    "What is its average speed?",
    lambda i: f"Sam has {_n(i, 1, 3, 6) * _n(i, 2, 2, 5) + _n(i, 3, 1, 9)} stickers and gives "
    f"{_n(i, 2, 2, 5)} to each of his {_n(i, 1, 3, 6)} friends. How many does he have left?",
    lambda i: f"A garden is {_n(i, 1, 4, 25)} m long and {_n(i, 2, 3, 12)} m wide. What are its "
    "area and perimeter?",
    lambda i: f"If {_n(i, 1, 2, 6)} people can paint a fence in {_n(i, 2, 3, 12)} hours, how long "
    f"would {_n(i, 3, 7, 12)} people take, working at the same speed?",
    lambda i: f"A jacket costs ${_n(i, 1, 4, 20) * 5}. It is on sale for {_n(i, 2, 1, 6) * 5}% "
    "off. What is the sale price?",
    lambda i: f"What is {_n(i, 1, 1, 19) * 5}% of {_n(i, 2, 2, 60) * 10}? Show the working.",
    lambda i: f"A recipe needs {_n(i, 1, 3, 12) * 25} grams of sugar for {_n(i, 2, 2, 6)} "
    f"people. How much sugar do I need for {_n(i, 3, 7, 15)} people?",
    lambda i: f"A tank holds {_n(i, 1, 6, 40) * 10} litres and a hose fills it at "
    f"{_n(i, 2, 4, 15)} litres per minute. How long does it take to fill the empty tank?",
    lambda i: f"Solve for x: {_n(i, 1, 2, 9)}x + {_n(i, 2, 1, 30)} = "
    f"{_n(i, 1, 2, 9) * _n(i, 3, 2, 12) + _n(i, 2, 1, 30)}",
    lambda i: f"The average of {_n(i, 1, 3, 9)} numbers is {_n(i, 2, 10, 40)}. If I add the "
    f"number {_n(i, 3, 5, 90)}, what is the new average?",
    lambda i: f"A phone plan costs ${_n(i, 1, 10, 30)} a month plus ${_n(i, 2, 1, 5)} per "
    f"gigabyte of data. How much is the bill for a month with {_n(i, 3, 2, 12)} GB?",
)  # fmt: skip

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
NAMES = ("Priya", "Tomas", "Mei", "Jonas", "Ruth", "Kofi", "Lena", "Omar", "Hana", "Felix")

REASONING: tuple[Callable[[int], str], ...] = (
    lambda i: f"A bag holds {_n(i, 1, 2, 9)} red, {_n(i, 2, 1, 8)} blue and {_n(i, 3, 1, 7)} "
    "green marbles. If I take one without looking, what is the probability that it is not "
    "blue? Show your reasoning.",
    lambda i: f"A meeting starts at {_n(i, 1, 8, 15)}:{_n(i, 2, 0, 3) * 15:02d} and lasts "
    f"{_n(i, 3, 3, 10) * 10} minutes. The next one starts {_n(i, 2, 1, 6) * 5} minutes after "
    "the first ends. When does the second meeting start?",
    lambda i: f"If today is {DAYS[i % 7]}, what day of the week will it be in "
    f"{_n(i, 1, 9, 100)} days? Explain your reasoning.",
    lambda i: f"A snail climbs {_n(i, 1, 3, 5)} metres up a wall each day and slips back "
    f"{_n(i, 2, 1, 2)} metres each night. The wall is {_n(i, 3, 10, 20)} metres tall. "
    "On which day does it reach the top?",
    lambda i: "Sort these numbers from smallest to largest, then give their sum: "
    + ", ".join(str(_n(i, k, 1, 99)) for k in range(1, 7)) + ".",
    lambda i: f"{NAMES[i % 10]} is taller than {NAMES[(i + 3) % 10]}, and "
    f"{NAMES[(i + 3) % 10]} is taller than {NAMES[(i + 6) % 10]}. Who is the shortest of the "
    "three? Explain step by step.",
    lambda i: f"Is {_n(i, 1, 100, 999) * 10 + _n(i, 2, 1, 9)} divisible by 3? Explain how you "
    "can tell without a calculator.",
    lambda i: f"A bus leaves every {_n(i, 1, 2, 6) * 5} minutes, starting at 6:00. I arrive at "
    f"the stop at 6:{_n(i, 2, 1, 59):02d}. How long do I wait? Think it through step by step.",
    lambda i: f"{NAMES[(i + 1) % 10]} is {_n(i, 1, 2, 9)} years older than "
    f"{NAMES[(i + 5) % 10]}. In {_n(i, 2, 2, 6)} years their ages will add up to "
    f"{2 * _n(i, 3, 8, 30) + _n(i, 1, 2, 9) + 2 * _n(i, 2, 2, 6)}. How old is each of them now?",
    lambda i: f"I have {_n(i, 1, 3, 7)} shirts and {_n(i, 2, 2, 5)} pairs of trousers. How many "
    f"different outfits can I make, and how many if I also choose one of {_n(i, 3, 2, 4)} hats?",
)  # fmt: skip


def chat_prompt_ids(tokenizer: Any, instructions: Sequence[str]) -> list[list[int]]:
    """Token ids of each instruction as a one-turn user conversation in the model's chat
    template, ending with the assistant's generation prompt (as LLM.chat renders it).

    tokenizer: a Hugging Face tokenizer (LLM.tokenizer) or verispec's Tokenizer.
    """
    hf = getattr(tokenizer, "hf", tokenizer)
    name = str(getattr(hf, "name_or_path", "") or "the target")
    return [chat_prompt(hf, [{"role": "user", "content": text}], name)[1]
            for text in instructions]  # fmt: skip
