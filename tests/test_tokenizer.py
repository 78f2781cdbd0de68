"""Tokenizer: the cheap tokenizer-files check and the chat template of a checkpoint."""

from __future__ import annotations

import shutil

import pytest

from verispec.models.weights.loader import check_tokenizer_files
from verispec.tokenizer import Tokenizer


@pytest.mark.parametrize(
    "files", [["tokenizer.json"], ["tokenizer.model"], ["vocab.json", "merges.txt"]]
)
def test_any_vocabulary_file_passes_the_check(tmp_path, files) -> None:
    for name in files:
        (tmp_path / name).write_text("")
    check_tokenizer_files(tmp_path)


def test_a_lone_vocab_json_is_not_enough(tmp_path) -> None:
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"missing tokenizer\.json \(or tokenizer\.model, or "
                       r"vocab\.json \+ merges\.txt\)$"):  # fmt: skip
        check_tokenizer_files(tmp_path)


def test_checkpoint_without_chat_template(llama_checkpoint) -> None:
    tokenizer = Tokenizer(llama_checkpoint)
    assert tokenizer.chat_template is None
    assert tokenizer.eos_token_ids == [1]


def test_chat_template_from_tokenizer_config(llama_checkpoint, tmp_path) -> None:
    path = shutil.copytree(llama_checkpoint, tmp_path / "ckpt")
    template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    (path / "chat_template.jinja").write_text(template)
    assert Tokenizer(path).chat_template == template


def test_unloadable_tokenizer_names_the_checkpoint(llama_checkpoint, tmp_path) -> None:
    path = shutil.copytree(llama_checkpoint, tmp_path / "ckpt")
    (path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match=f"cannot load a tokenizer from {path}"):
        Tokenizer(path)
