"""A chat template and a tiny checkpoint whose tokenizer carries it, for the chat tests of the
API, the command line, the server and the audit."""

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
CONVERSATION = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "def add(a, b):"},
]


def with_chat_template(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """A copy of the tokenizer with TEMPLATE as its chat template."""
    chat_tokenizer = copy.deepcopy(tokenizer)
    chat_tokenizer.chat_template = TEMPLATE
    return chat_tokenizer


def make_chat_checkpoint(path: Path, tokenizer: PreTrainedTokenizerFast) -> Path:
    """A sharp tiny Llama whose tokenizer has TEMPLATE as its chat template."""
    make_checkpoint(path, "llama", with_chat_template(tokenizer), layer_scale=8.0)
    return path
