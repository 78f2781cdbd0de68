"""Chat input checks and chat-template application (verispec/types/chat.py), and LLM.chat on a tiny
checkpoint whose tokenizer has a chat template."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tests.helpers.chat import CONVERSATION, make_chat_checkpoint
from verispec import LLM, SamplingParams
from verispec.types.chat import (
    RESERVED_TEMPLATE_NAMES,
    ROLES,
    as_conversations,
    chat_prompt,
    check_text,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits

OTHER = [{"role": "user", "content": "class Point:"}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    return make_chat_checkpoint(tmp_path_factory.mktemp("chat"), tokenizer)


@pytest.fixture(scope="module")
def chat_llm(chat_checkpoint: Path) -> LLM:
    return LLM(model=str(chat_checkpoint))


def test_templated_ids_equal_transformers_and_hold_one_bos(
    chat_llm: LLM, chat_checkpoint: Path
) -> None:
    text, ids = chat_prompt(chat_llm.tokenizer, CONVERSATION, "tiny")
    hf = AutoTokenizer.from_pretrained(str(chat_checkpoint))
    expected = hf.apply_chat_template(
        CONVERSATION, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids == list(expected)
    assert ids.count(0) == 1 and ids[0] == 0  # the template's BOS, no second one from encode()
    assert text.startswith("<s><|system|>\n") and text.endswith("<|assistant|>\n")


def test_greedy_chat_equals_generate_on_the_templated_ids(chat_llm: LLM) -> None:
    text, ids = chat_prompt(chat_llm.tokenizer, CONVERSATION, "tiny")
    (out,) = chat_llm.chat(CONVERSATION, GREEDY)
    (plain,) = chat_llm.generate(ids, GREEDY)
    assert out.token_ids == plain.token_ids and out.text == plain.text
    assert (out.prompt, out.prompt_token_ids) == (text, ids)


def test_chat_takes_a_list_of_conversations(chat_llm: LLM) -> None:
    outs = chat_llm.chat([CONVERSATION, OTHER], [GREEDY, GREEDY], use_tqdm=True)
    assert [o.token_ids for o in outs] == [
        chat_llm.chat(c, GREEDY)[0].token_ids for c in (CONVERSATION, OTHER)
    ]


def test_chat_template_kwargs_reach_the_template(chat_llm: LLM) -> None:
    (out,) = chat_llm.chat(OTHER, GREEDY, chat_template_kwargs={"bos_token": "<B>"})
    assert out.prompt == "<B><|user|>\nclass Point:</s>\n<|assistant|>\n"
    with pytest.raises(ValueError, match="chat_template_kwargs must be a dict, got list"):
        chat_llm.chat(OTHER, GREEDY, chat_template_kwargs=[("a", 1)])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["conversation", "documents", "tokenize", "chat_template",
                                  "add_generation_prompt", "continue_final_message", "return_dict",
                                  "tokenizer_kwargs", "tools", "messages", "self", "range",
                                  "raise_exception"])  # fmt: skip
def test_a_reserved_template_name_is_a_value_error_naming_it(chat_llm: LLM, name: str) -> None:
    """Before, conversation and documents were a TypeError, chat_template ran the caller's own
    Jinja, and add_generation_prompt changed the prompt."""
    with pytest.raises(ValueError, match=f"chat_template_kwargs must not set '{name}'"):
        chat_llm.chat(OTHER, GREEDY, chat_template_kwargs={name: 1})
    assert {"conversation", "documents", "chat_template", "tokenize", "add_generation_prompt",
            "continue_final_message", "return_dict", "tokenizer_kwargs"} <= RESERVED_TEMPLATE_NAMES


def test_any_failure_of_the_template_is_a_value_error(tokenizer: PreTrainedTokenizerFast) -> None:
    """A variable the template calls but which is not callable was a TypeError."""
    calls = copy.deepcopy(tokenizer)
    calls.chat_template = "{{ greet() }}"
    with pytest.raises(ValueError, match="refused the messages: TypeError: 'str' object is not"):
        chat_prompt(calls, OTHER, "m", {"greet": "hello"})


def test_model_without_a_chat_template_is_a_value_error(llama_checkpoint: Path) -> None:
    llm = LLM(model=str(llama_checkpoint))
    message = f"model {llama_checkpoint} has no chat template; use generate() with a plain prompt"
    with pytest.raises(ValueError, match=re.escape(message)):
        llm.chat(OTHER)


def test_a_template_that_raises_is_a_value_error(tokenizer: PreTrainedTokenizerFast) -> None:
    strict = copy.deepcopy(tokenizer)
    strict.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ValueError, match="template of model m refused the messages: roles must"):
        chat_prompt(strict, OTHER, "m")


def test_roles_extra_keys_and_tool_messages_pass() -> None:
    conversation = [{"role": r, "content": r, "name": "x"} for r in ROLES]
    assert as_conversations(conversation) == [conversation]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "the conversation is empty; give at least one message"),
        ([[]], "conversation 0: the conversation is empty"),
        ("hello", "messages must be a list of .* got str"),
        ({"role": "user", "content": "x"}, "messages must be a list of .* got dict"),
        ([{"role": "robot", "content": "x"}],
         "message 0 has role 'robot'; allowed roles: system, user, assistant, tool"),
        ([{"role": "user", "content": "a"}, {"content": "b"}], "message 1 has no 'role'"),
        ([{"role": "user"}], "message 0 has no 'content'"),
        ([{"role": "user", "content": None}], "message 0 content must be a string, got NoneType"),
        ([{"role": "user", "content": b"x"}], "message 0 content must be a string, got bytes"),
        ([{"role": "user", "content": "a"}, "b"], "message 1 must be a dict .* got str"),
        ([OTHER, [*OTHER, {"role": "bot", "content": "x"}]],
         "conversation 1: message 1 has role 'bot'"),
        ([{"role": "user", "content": "a\udc80"}],
         r"message 0 content is not valid UTF-8 text \(lone surrogate at index 1\)"),
    ],
)  # fmt: skip
def test_bad_messages_are_value_errors(messages: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        as_conversations(messages)  # type: ignore[arg-type]


def test_bad_messages_reach_llm_chat_and_queue_nothing(chat_llm: LLM) -> None:
    with pytest.raises(ValueError, match="message 1 has role 'robot'"):
        chat_llm.chat([OTHER, [*OTHER, {"role": "robot", "content": "x"}]])
    assert not chat_llm.engine.has_unfinished()


def test_check_text_names_the_first_lone_surrogate() -> None:
    assert check_text("déjà vu €") == "déjà vu €"
    with pytest.raises(ValueError, match=r"^prompt is not valid UTF-8 text \(lone surrogate at"):
        check_text("abc\udc80")
    with pytest.raises(ValueError, match=r"^the line is not .* at index 2\)$"):
        check_text("ab\ud800\udc00", "the line")  # a pair split into two code points
