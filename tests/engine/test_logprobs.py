"""Logprobs (SamplingParams.logprobs): the target's log-softmax at every emitted token, the same
whether the token was an accepted draft or the target's own (the verifying forward's row)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.helpers.checkpoints import SPEC_PAIRS
from verispec import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "for i in range(10):"


def expected_logprobs(path: str, prompt: list[int], output: list[int]) -> torch.Tensor:
    """transformers' log-softmax [len(output), vocab] at the positions that predicted output."""
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculative_logprobs_equal_plain_and_transformers(spec_pair, temperature) -> None:
    target, draft = spec_pair
    params = SamplingParams(temperature=temperature, max_tokens=20, seed=5, logprobs=3,
                            ignore_eos=True)  # fmt: skip
    spec = LLM(model=str(target), batch_invariant=True,
               speculative={"model": str(draft), "num_speculative_tokens": 4})  # fmt: skip
    out = spec.generate(PROMPT, params)[0]
    assert out.metrics.spec.num_accepted_tokens > 0
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    assert [t.token_id for t in out.logprobs] == out.token_ids
    want = expected_logprobs(str(target), out.prompt_token_ids, out.token_ids)
    got = torch.tensor([t.logprob for t in out.logprobs])
    assert torch.allclose(got, want.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0],
                          atol=1e-4)  # fmt: skip
    for entry, row in zip(out.logprobs, want, strict=True):
        top = row.topk(3)
        assert [i for i, _ in entry.top] == top.indices.tolist()
        assert [v for _, v in entry.top] == pytest.approx(top.values.tolist(), abs=1e-4)
    if temperature == 0:  # batch-invariant: plain decoding's logprobs, bit for bit
        plain = LLM(model=str(target), batch_invariant=True, speculative=None)
        ref = plain.generate(PROMPT, params)[0]
        assert ref.token_ids == out.token_ids
        assert [t.logprob for t in ref.logprobs] == [t.logprob for t in out.logprobs]
        assert [t.top for t in ref.logprobs] == [t.top for t in out.logprobs]


def test_no_logprobs_unless_asked_and_bad_values_refused(llama_checkpoint) -> None:
    llm = LLM(model=str(llama_checkpoint))
    assert llm.generate(PROMPT, SamplingParams(max_tokens=3))[0].logprobs is None
    only = llm.generate(PROMPT, SamplingParams(max_tokens=3, logprobs=0))[0].logprobs
    assert only is not None and len(only) == 3 and all(t.top == [] for t in only)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="logprobs"):
            SamplingParams(logprobs=bad)
