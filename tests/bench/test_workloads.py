"""The benchmark's shipped workload files, and how prompts become token ids."""

from __future__ import annotations

import ast
import copy
import difflib
import platform
import re

import pytest

from verispec.bench.workloads import (
    BUILT_WITH_PYTHON,
    WORKLOADS,
    ChatPrompt,
    build_workload,
    parse_row,
    prompt_token_ids,
)
from verispec.data.corpus import corpus_files
from verispec.train.instructions import all_instructions, topics
from verispec.train.prompts import MAX_PROMPT_CHARS, Prompt
from verispec.types.chat import ROLES

BUILT = sorted(name for name, w in WORKLOADS.items() if not w.chat)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("name", BUILT)
def test_shipped_prompt_files(name: str) -> None:
    workload = WORKLOADS[name]
    prompts = workload.prompts()
    assert len(prompts) == workload.num_prompts and len(workload.prompts(4)) == 4
    assert all(isinstance(p, Prompt) and len(p.text) <= MAX_PROMPT_CHARS for p in prompts)
    if platform.python_version() == BUILT_WITH_PYTHON:  # same stdlib: the files rebuild exactly
        assert build_workload(workload, corpus_files("heldout")) == prompts


def test_chat_workload_file() -> None:
    workload = WORKLOADS["chat"]
    prompts = workload.prompts()
    assert workload.chat and workload.max_tokens == 96
    assert len(prompts) == workload.num_prompts >= 32
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert isinstance(p, ChatPrompt) and p.messages[-1]["role"] == "user"
        assert all(m["role"] in ROLES and m["content"].strip() for m in p.messages)
    # rewriting and summarising rows carry their paragraph: prompt lookup's home ground
    assert sum(len(p.messages[-1]["content"]) > 300 for p in prompts) >= 8
    assert len(workload.prompts(6)) == 6
    with pytest.raises(ValueError, match="written by hand"):
        build_workload(workload, [])


def test_agentic_workload_file() -> None:
    """Four agents (one system prompt each) with eight conversations each, a third of them
    quoting an earlier assistant turn: later outputs repeat earlier ones' structure."""
    workload = WORKLOADS["agentic"]
    prompts = workload.prompts()
    assert workload.chat and len(prompts) == workload.num_prompts == 32
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert isinstance(p, ChatPrompt) and p.messages[0]["role"] == "system"
        assert p.messages[-1]["role"] in ("user", "tool")
        assert all(m["role"] in ROLES and m["content"].strip() for m in p.messages)
    systems = [p.messages[0]["content"] for p in prompts if isinstance(p, ChatPrompt)]
    assert sorted(systems.count(s) for s in set(systems)) == [8, 8, 8, 8]
    quoting = [p for p in prompts if isinstance(p, ChatPrompt)
               if any(m["role"] == "assistant" for m in p.messages)]  # fmt: skip
    assert len(quoting) >= 12


def test_parse_row_checks_roles() -> None:
    assert parse_row({"id": "a", "prompt": "x = 1"}) == Prompt("a", "x = 1")
    chat = parse_row({"id": "b", "messages": [{"role": "user", "content": "Hi"}]})
    assert chat == ChatPrompt("b", ({"role": "user", "content": "Hi"},))
    with pytest.raises(ValueError, match="role"):
        parse_row({"id": "c", "messages": [{"role": "robot", "content": "Hi"}]})


def test_prompt_token_ids_applies_the_chat_template(tokenizer) -> None:
    chat_tokenizer = copy.deepcopy(tokenizer)
    chat_tokenizer.chat_template = CHATML
    chat = ChatPrompt("q", ({"role": "user", "content": "def add(a, b):"},))
    text = "<|im_start|>user\ndef add(a, b):<|im_end|>\n<|im_start|>assistant\n"
    expected = chat_tokenizer(text, add_special_tokens=False).input_ids
    assert prompt_token_ids(chat_tokenizer, chat) == expected
    assert prompt_token_ids(tokenizer, Prompt("p", "x = 1")) == tokenizer("x = 1").input_ids
    with pytest.raises(ValueError, match="no chat template"):
        prompt_token_ids(tokenizer, chat)


def user_texts(name: str) -> list[str]:
    """The last user message of every prompt of a chat workload."""
    return [p.messages[-1]["content"] for p in WORKLOADS[name].prompts()
            if isinstance(p, ChatPrompt)]  # fmt: skip


def near_copies(texts: list[str], others: list[str], ratio: float = 0.75) -> list[tuple[str, str]]:
    """(text, other) pairs whose lower-cased characters match at least `ratio` (difflib's)."""
    found = []
    for text in texts:
        matcher = difflib.SequenceMatcher(None, b=text.lower(), autojunk=False)
        for other in others:
            matcher.set_seq1(other.lower())
            if matcher.real_quick_ratio() >= ratio and matcher.quick_ratio() >= ratio:
                if matcher.ratio() >= ratio:
                    found.append((text, other))
    return found


def test_near_copies_finds_an_edited_instruction() -> None:
    training = ["Write a Python function that returns the n-th Fibonacci number."]
    edited = "Write a python function which returns the nth Fibonacci number"
    assert near_copies([edited], training) == [(edited, training[0])]
    assert near_copies(["Write a Go function that retries a call."], training) == []


@pytest.mark.parametrize("name", ["code_chat", "code_edit"])
def test_code_workloads_share_no_training_instruction(name: str) -> None:
    """Held out from self-distillation: no instruction the drafters train on (verispec.train.
    instructions, both splits), nor a near-copy of one, nor a fill of its templates (a function
    to write, a snippet or a bug) appears in a code workload."""
    texts = user_texts(name)
    training = all_instructions()
    assert not set(texts) & set(training)
    assert near_copies(texts, training) == []
    fills = topics()
    subjects = [str(f).lower() for f in fills["functions"]]
    code = [str(f).lower() for f in fills["snippets"]] + [b[1].lower() for b in fills["bugs"]]
    for text in (t.lower() for t in texts):
        assert not [s for s in subjects + code if s in text], text


def test_code_chat_workload_file() -> None:
    workload = WORKLOADS["code_chat"]
    prompts = workload.prompts()
    assert workload.chat and workload.max_tokens == 256
    assert len(prompts) == workload.num_prompts and 12 <= len(prompts) <= 16
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert isinstance(p, ChatPrompt) and [m["role"] for m in p.messages] == ["user"]
        assert p.messages[0]["content"].strip() == p.messages[0]["content"]
    languages = {p.id.split("-")[0] for p in prompts}  # ids start with the language
    assert "py" in languages and len(languages) >= 3
    assert len(set(user_texts("code_chat"))) == len(prompts)


def test_code_edit_workload_file() -> None:
    """Each request gives one whole function of 10-40 lines in a fenced block and asks for one
    small change; max_tokens leaves room for the whole function rewritten."""
    workload = WORKLOADS["code_edit"]
    prompts = workload.prompts()
    assert workload.chat and len(prompts) == workload.num_prompts and 12 <= len(prompts) <= 16
    assert len({p.id for p in prompts}) == len(prompts)
    for text in user_texts("code_edit"):
        blocks = re.findall(r"```(\w+)\n(.*?)\n```", text, re.S)
        assert len(blocks) == 1, text[:80]
        language, code = blocks[0]
        assert 10 <= len(code.splitlines()) <= 40 and workload.max_tokens >= len(code) // 2
        assert re.search(r"^(def|class|function|func|fn) ", code, re.M), code[:80]
        request = text[: text.index("```")].strip()
        assert request and len(request) < 300
        if language == "python":
            ast.parse(code)  # the given code is valid Python
