"""GGUF loading: tiny checkpoints written the way llama.cpp's converter writes them (see the
write_gguf fixture), for every family and several tensor types, against transformers' own GGUF
loading of the same file; and the errors for files we cannot load."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoModelForCausalLM, PreTrainedModel

from tests.helpers.checkpoints import CORPUS, make_checkpoint
from tests.helpers.gguf_files import CHATML, llama_cpp_permute
from tests.helpers.harness import Runner, hf_logits, random_ids
from verispec import LLM, SamplingParams
from verispec.models.kernels.backends import native_usable
from verispec.models.kernels.ffi import WeightFormat
from verispec.models.llama import LlamaModel
from verispec.models.weights.gguf import BlockEmbedding, hf_tensor_name, unpermute_rotary_rows
from verispec.models.weights.loader import load_model, resolve_model_path
from verispec.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
# K-quant blocks hold 256 values, so those cases need rows (hidden, intermediate) of 256.
WIDE = {"hidden_size": 256, "intermediate_size": 512}
# transformers reads no head_dim from a qwen3 GGUF and assumes Qwen3's 128.
QWEN3 = {"head_dim": 128, "num_attention_heads": 2, "num_key_value_heads": 1}
CASES = (
    ("llama", "F16", {}),
    ("llama", "Q8_0", {}),
    ("mistral", "Q4_0", {"sliding_window": None}),  # llama.cpp keeps no Mistral window
    ("qwen2", "Q8_0", {}),
    ("qwen3", "Q4_0", QWEN3),
    ("qwen2", "Q5_0", {}),
    ("llama", "Q4_1", {}),
    ("mistral", "Q5_1", {"sliding_window": None}),
    ("qwen2", "BF16", {}),
    ("llama", "Q4_K", WIDE),
    ("llama", "Q5_K", WIDE),
    ("qwen2", "Q6_K", WIDE),
    ("qwen3", "Q6_K", {**WIDE, **QWEN3}),
)
NEW_TOKENS = 8


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A verispec cache for this module: the GGUF files here are converted into it (see
    test_gguf_cache.py), never into the user's."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("cache")
        patch.setenv("VERISPEC_CACHE", str(path))
        patch.delenv("VERISPEC_NO_GGUF_CACHE", raising=False)
        yield path


@dataclass(slots=True)
class Case:
    """One GGUF file with our model and transformers' model loaded from it."""

    path: Path
    ours: LlamaModel
    hf: PreTrainedModel
    """transformers' float32 model read from the same GGUF file."""
    source: PreTrainedModel
    """The transformers model the file was written from (before quantization)."""
    qtype: str
    """The GGML type of its 2-D weights."""


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def case(request: pytest.FixtureRequest, tmp_path_factory, tokenizer, write_gguf) -> Case:
    family, qtype, overrides = request.param
    root = tmp_path_factory.mktemp(f"gguf-{family}-{qtype}")
    source = make_checkpoint(root / "hf", family, tokenizer, layer_scale=8.0, **overrides)
    path = root / "model.gguf"
    write_gguf(path, source, tokenizer, qtype)
    hf = AutoModelForCausalLM.from_pretrained(root, gguf_file=path.name, dtype=torch.float32)
    return Case(path, load_model(path, torch.float32, CPU), hf.eval(), source, qtype)


def test_logits_match_transformers_gguf_load(case: Case) -> None:
    ids = random_ids(30, case.source.config.vocab_size, seed=5)
    ours = Runner(case.ours).prefill(ids, num_logits=len(ids))  # [T, vocab]
    assert_close(ours, hf_logits(case.hf, ids), atol=1e-4, rtol=0)


def test_greedy_tokens_match_transformers(case: Case) -> None:
    prompt = random_ids(6, case.source.config.vocab_size, seed=9)
    input_ids = torch.tensor([prompt])
    expected = case.hf.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
        max_new_tokens=NEW_TOKENS, eos_token_id=None,
    )[0, len(prompt):].tolist()  # fmt: skip
    # exact float inputs: transformers computes the dequantized weights in float32
    llm = LLM(model=str(case.path), speculative=None, max_model_len=64, quantization=None)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    [output] = llm.generate([prompt], params)
    assert output.token_ids == expected
    assert len(set(expected)) > 1  # the case is sharp enough to say something


def test_quantized_blocks_run_as_their_codes(case: Case) -> None:
    """No quantized weight was widened to float: each is packed as the file's integer codes
    (where the native kernel runs), the embedding table left as its blocks."""
    if not native_usable():
        pytest.skip("the native kernel cannot run here")
    qtype = case.qtype
    linears = [lin for la in case.ours.layers for lin in (la.qkv, la.o, la.gate_up, la.down)]
    if qtype in ("F16", "BF16"):
        return
    assert all(lin.kernel == "native" for lin in linears)
    assert all(lin.packed.codes.dtype in (torch.int8, torch.uint8) for lin in linears), qtype
    assert isinstance(case.ours.embed, BlockEmbedding)
    if qtype == "Q6_K":  # the file's codes and d as stored (Q6_SUPER_D), its LM head too
        heads = [*linears, case.ours.lm_head]
        assert {lin.packed.format for lin in heads} == {
            WeightFormat.Q6_SUPER_D
        }


def test_a_head_cut_to_vocab_ids_packs_those_rows_only(case: Case) -> None:
    """A reduced head (a draft's) is cut from the file's codes before packing, in the same
    format (a tied head: from the embedding table's blocks, the table left whole on disk), and
    scores what the whole head scores at those ids."""
    ids = torch.tensor([0, 1, 2, *range(5, 320, 3)])  # 108 ids: not a multiple of 16 rows
    cut = load_model(case.path, torch.float32, CPU, vocab_ids=ids)
    head, whole = cut.lm_head, case.ours.lm_head
    assert head.out_features == len(ids) and head.kernel == whole.kernel
    if head.kernel == "native":
        assert (head.packed.format, head.packed.out_features) == (whole.packed.format, len(ids))
    assert type(cut.embed) is type(case.ours.embed) and cut.embed.shape == case.ours.embed.shape
    tokens = random_ids(20, case.source.config.vocab_size, seed=4)
    expected = Runner(case.ours).prefill(tokens, num_logits=20)[:, ids]
    assert_close(Runner(cut).prefill(tokens, num_logits=20), expected, atol=1e-5, rtol=0)


def test_config_comes_from_the_metadata(case: Case) -> None:
    hf, ours = case.source.config, case.ours.config
    assert ours.architecture == type(case.source).__name__
    assert (ours.num_layers, ours.hidden_size, ours.intermediate_size) == (
        hf.num_hidden_layers, hf.hidden_size, hf.intermediate_size,
    )  # fmt: skip
    assert (ours.num_heads, ours.num_kv_heads, ours.head_dim) == (
        hf.num_attention_heads, hf.num_key_value_heads,
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
    )  # fmt: skip
    assert ours.vocab_size == hf.vocab_size
    assert ours.tie_word_embeddings == hf.tie_word_embeddings
    assert ours.qkv_bias == (hf.model_type == "qwen2")
    assert ours.qk_norm == (hf.model_type == "qwen3")
    assert ours.rope_theta == hf.rope_parameters["rope_theta"]
    assert ours.rms_norm_eps == pytest.approx(hf.rms_norm_eps)
    assert ours.max_position_embeddings == hf.max_position_embeddings
    assert (ours.bos_token_id, ours.eos_token_ids) == (0, [1])


def test_tokenizer_and_chat_template_come_from_the_metadata(
    tmp_path, tokenizer, llama_checkpoint, write_gguf
) -> None:
    source = AutoModelForCausalLM.from_pretrained(llama_checkpoint)
    write_gguf(tmp_path / "model.gguf", source, tokenizer)
    ours = Tokenizer(tmp_path / "model.gguf")
    for text in CORPUS:
        assert ours.encode(text) == tokenizer.encode(text)
    assert ours.eos_token_ids == [tokenizer.eos_token_id]
    assert ours.chat_template == CHATML
    messages = [{"role": "user", "content": "hi"}]
    text = ours.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_directory_with_one_gguf_resolves_to_it(tmp_path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"")
    assert resolve_model_path(tmp_path) == tmp_path / "model.gguf"
    (tmp_path / "other.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match=r"several \.gguf files \(model\.gguf, other\.gguf\)"):
        resolve_model_path(tmp_path)


def test_unpermute_inverts_llama_cpp_permute() -> None:
    weight = torch.arange(4 * 16 * 3).reshape(4 * 16, 3)  # 4 heads of 16 rows
    permuted = torch.from_numpy(llama_cpp_permute(weight.numpy(), 4))
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute_rotary_rows(permuted, 4), weight)
    assert unpermute_rotary_rows(torch.tensor([10, 12, 11, 13]), 1).tolist() == [10, 11, 12, 13]


def test_tensor_names() -> None:
    assert (
        hf_tensor_name("blk.3.attn_q.bias", Path("m.gguf"))
        == "model.layers.3.self_attn.q_proj.bias"
    )
    assert hf_tensor_name("output.weight", Path("m.gguf")) == "lm_head.weight"
    with pytest.raises(ValueError, match=r"m\.gguf has tensor 'blk\.0\.ffn_gate_exps\.weight'"):
        hf_tensor_name("blk.0.ffn_gate_exps.weight", Path("m.gguf"))


@pytest.fixture(scope="module")
def llama_source(llama_checkpoint) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(llama_checkpoint)


def write_and_load(path: Path, write_gguf, source, tokenizer, **options: Any) -> LlamaModel:
    write_gguf(path, source, tokenizer, **options)
    return load_model(path, torch.float32, CPU)


def test_runtime_dtype_applies_after_dequantizing(tmp_path, write_gguf, llama_source, tokenizer):
    path = tmp_path / "m.gguf"
    write_gguf(path, llama_source, tokenizer, qtype="Q8_0")
    wide = load_model(path, torch.float32, CPU)
    narrow = load_model(path, torch.bfloat16, CPU)
    assert (wide.dtype, narrow.dtype) == (torch.float32, torch.bfloat16)
    assert torch.equal(narrow.embed, wide.embed.float().to(torch.bfloat16))


def test_truncated_gguf_names_the_file(tmp_path, write_gguf, llama_source, tokenizer) -> None:
    path = tmp_path / "cut.gguf"
    write_gguf(path, llama_source, tokenizer)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"GGUF file {path} is truncated or not a GGUF file"):
        load_model(path, torch.float32, CPU)


def test_file_that_is_not_gguf(tmp_path) -> None:
    path = tmp_path / "fake.gguf"
    path.write_text("this is a text file, not a GGUF one\n" * 10)
    with pytest.raises(ValueError, match=rf"GGUF file {path} is truncated or not a GGUF file"):
        load_model(path, torch.float32, CPU)


def test_unsupported_tensor_type(tmp_path, write_gguf, llama_source, tokenizer) -> None:
    with pytest.raises(ValueError, match="has type I32, which cannot be dequantized") as error:
        write_and_load(tmp_path / "m.gguf", write_gguf, llama_source, tokenizer, qtype="I32")
    assert all(t in str(error.value) for t in ("F16", "BF16", "Q4_1", "Q4_K", "Q6_K"))


def test_unsupported_architecture(tmp_path, write_gguf, llama_source, tokenizer) -> None:
    with pytest.raises(ValueError, match=r"unsupported architecture 'phi3'; supported: llama"):
        write_and_load(tmp_path / "m.gguf", write_gguf, llama_source, tokenizer, arch="phi3")


def test_gguf_without_tokenizer(tmp_path, write_gguf, llama_source, tokenizer) -> None:
    with pytest.raises(ValueError, match=r"has no tokenizer: missing tokenizer\.ggml\.model"):
        write_and_load(
            tmp_path / "m.gguf", write_gguf, llama_source, tokenizer, tokenizer_metadata=False
        )
