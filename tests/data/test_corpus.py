"""The standard-library corpus: deterministic files, a held-out split disjoint from training."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from verispec.data.corpus import (
    HELDOUT_MODULES,
    corpus_files,
    is_heldout,
    stdlib_root,
    tokenize_files,
)


def test_heldout_split_is_the_listed_modules_and_disjoint_from_train() -> None:
    train, heldout = corpus_files("train"), corpus_files("heldout")
    assert sorted(p.stem for p in heldout) == sorted(HELDOUT_MODULES)
    assert not set(train) & set(heldout)
    assert train == sorted(train) and len(train) > 500
    root = stdlib_root()
    names = {p.relative_to(root).as_posix() for p in train}
    assert "textwrap.py" not in names and "test/test_textwrap.py" not in names
    assert "json/__init__.py" in names and "os.py" in names


def test_is_heldout_covers_module_and_its_tests_only() -> None:
    assert is_heldout(Path("textwrap.py")) and is_heldout(Path("test/test_textwrap.py"))
    assert not is_heldout(Path("email/textwrap.py")) and not is_heldout(Path("os.py"))
    assert not is_heldout(Path("test/textwrap_helper.py"))


def test_bad_split_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="split must be"):
        corpus_files("test")


def test_fake_root_and_token_stream(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    (tmp_path / "bisect.py").write_text("def f():\n    pass\n")
    (tmp_path / "bad.py").write_bytes(b"\xff\xfe not utf-8")
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "c.py").write_text("z = 3\n")
    train = corpus_files("train", tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in train] == ["b.py", "bad.py", "pkg/a.py"]
    stream = tokenize_files(tokenizer, train)
    assert stream.num_documents == 2  # the non-UTF-8 file is skipped
    ids = stream.tokens.tolist()
    assert ids.count(tokenizer.bos_token_id) == 2 and ids.count(tokenizer.eos_token_id) == 2
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "y = 2\nx = 1\n"
