"""Chat templates and a tiny checkpoint whose tokenizer carries one, for the chat tests of the
API, the command line, the server and the audit: TEMPLATE (no tools) and TOOLS_TEMPLATE, which
renders tools, tool calls and tool results in Qwen2.5's format (the Hermes tool-call blocks)."""

from __future__ import annotations

import copy
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from tests.helpers.checkpoints import make_checkpoint

# ChatML-like, with the tokenizer's own BOS (<s>, id 0), which its encode() also prepends
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Qwen2.5's layout: the tools as JSON lines in the system turn, an assistant's calls as
# <tool_call> blocks, consecutive tool results as <tool_response> blocks of one user turn;
# without tools it renders what TEMPLATE renders. Transformers renders templates with
# trim_blocks, which drops a newline right after a tag: those are written {{ '\n' }}
TOOLS_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call functions. Their signatures:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\n"
    "Call one with a JSON object of its name and arguments in <tool_call></tool_call> tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call></s>\n'
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and tools and loop.first %}"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|user|>{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}</s>\n{% endif %}"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% for call in m['tool_calls'] or [] %}"
    "{% if m['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": "{{ call.function.name }}", "arguments": '
    "{{ call.function.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}</s>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "def add(a, b):"},
]


def with_chat_template(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """A copy of the tokenizer with TEMPLATE as its chat template."""
    chat_tokenizer = copy.deepcopy(tokenizer)
    chat_tokenizer.chat_template = TEMPLATE
    return chat_tokenizer


def with_tools_template(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """A copy of the tokenizer with TOOLS_TEMPLATE as its chat template."""
    chat_tokenizer = copy.deepcopy(tokenizer)
    chat_tokenizer.chat_template = TOOLS_TEMPLATE
    return chat_tokenizer


def make_chat_checkpoint(path: Path, tokenizer: PreTrainedTokenizerFast) -> Path:
    """A sharp tiny Llama whose tokenizer has TEMPLATE as its chat template."""
    make_checkpoint(path, "llama", with_chat_template(tokenizer), layer_scale=8.0)
    return path
