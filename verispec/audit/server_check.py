"""`verispec verify --server URL`: the checks through a running `verispec serve`, comparing
requests with speculation on against requests with `"speculative": false` (0 drafts: plain
decoding of the same engine; docs/serving.md).

Greedy: token ids (`return_token_ids`) per prompt; a difference is weighed with the top
logprobs of the plain answer (`logprobs`). Sampling: the API reports at most the 20 likeliest
tokens' logprobs, not the whole distribution, so the exact joint of the first two tokens
cannot be built; speculative samples are compared with as many plain samples instead (a
two-sample chi-square, audit/fit.py: compare), each side from distinct seeds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from verispec.audit.client import ServerClient, ServerError
from verispec.audit.fit import compare
from verispec.audit.report import (
    TOP_LOGPROBS,
    Check,
    DraftCounts,
    GreedyPrompt,
    SamplingPrompt,
    TopLogprobs,
    greedy_prompt,
    two_sample_prompt,
)
from verispec.bench.workloads import BenchPrompt, ChatPrompt
from verispec.config import MAX_TREE_NODES
from verispec.serve.protocol import MAX_N
from verispec.types.sampling_params import SamplingParams

SAMPLE_MAX_TOKENS = 2 + MAX_TREE_NODES
"""max_tokens of a sampling request: room for any k at the second step (the scheduler drafts
at most max_tokens - 2 there). The stream is closed once every choice has two tokens, and the
server aborts the rest."""
CONCURRENT_REQUESTS = 4
"""Requests in flight at once (each with up to MAX_N choices)."""


def run(
    client: ServerClient, prompts: Sequence[BenchPrompt], check: Check
) -> tuple[list[GreedyPrompt], list[SamplingPrompt], DraftCounts]:
    """The greedy or the sampling check (as check.params asks) of every prompt; an answer
    without verispec serve's fields is a ServerError."""
    try:
        if check.params.greedy:
            greedy, drafts = greedy_check(client, prompts, check.params.max_tokens,
                                          check.tolerance, check.strict)  # fmt: skip
            return greedy, [], drafts
        sampling, drafts = sampling_check(client, prompts, check.params, check.samples,
                                          check.seed, check.alpha)  # fmt: skip
        return [], sampling, drafts
    except (KeyError, TypeError, IndexError) as e:
        raise ServerError(
            0,
            f"{client.url} answered without the fields verispec serve sends "
            f"({type(e).__name__}: {e}); is it verispec serve?",
        ) from None


def model_name(client: ServerClient) -> str:
    """The served model's name (GET /v1/models)."""
    data = client.get("/v1/models").get("data") or [{}]
    return str(data[0].get("id", "?"))


def takes_chat(client: ServerClient) -> bool:
    """Whether the server's model has a chat template (a one-token chat request succeeds)."""
    try:
        client.post("/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})  # fmt: skip
    except ServerError as e:
        if e.status != 400 or "chat template" not in str(e):
            raise
        return False
    return True


def _body(prompt: BenchPrompt) -> tuple[str, dict[str, Any]]:
    """The route and prompt field of a prompt: chat messages or completion text."""
    if isinstance(prompt, ChatPrompt):
        return "/v1/chat/completions", {"messages": [dict(m) for m in prompt.messages]}
    return "/v1/completions", {"prompt": prompt.text}


def _logprobs(chat: bool, top: int) -> dict[str, Any]:
    return {"logprobs": True, "top_logprobs": top} if chat else {"logprobs": top}


def _keys_and_top(choice: dict[str, Any], chat: bool) -> tuple[list[str], list[TopLogprobs]]:
    """Each output token's text and its likeliest alternatives (text, logprob)."""
    lp = choice.get("logprobs") or {}
    if chat:
        content = lp.get("content") or []
        keys = [c["token"] for c in content]
        top = [[(t["token"], t["logprob"]) for t in c["top_logprobs"]] for c in content]
        return keys, top
    keys = list(lp.get("tokens") or [])
    # completions key alternatives by text; two ids with one text keep the likelier, so the
    # less likely one is lost: its gap is then unknown (a real divergence, never a hidden one)
    top = [sorted(d.items(), key=lambda kv: -kv[1]) for d in lp.get("top_logprobs") or []]
    return keys, top


def greedy_check(
    client: ServerClient,
    prompts: Sequence[BenchPrompt],
    max_tokens: int,
    tolerance: float,
    strict: bool,
) -> tuple[list[GreedyPrompt], DraftCounts]:
    """Each prompt answered greedily with speculation on and off (EOS ignored, max_tokens
    each); the runs of a prompt are compared token by token."""
    jobs = []
    for prompt in prompts:
        route, body = _body(prompt)
        body |= _logprobs(isinstance(prompt, ChatPrompt), TOP_LOGPROBS) | {
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True,
        }  # fmt: skip
        jobs += [(route, {**body, "speculative": on}) for on in (True, False)]
    with ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        answers = list(pool.map(lambda job: client.post(*job), jobs))
    results, drafts = [], DraftCounts()
    for i, prompt in enumerate(prompts):
        on, off = answers[2 * i], answers[2 * i + 1]
        if off["speculation"]["num_draft_tokens"]:
            raise ServerError(0, "the server verified drafts for a request with speculative: "
                              "false; it does not honour the switch")  # fmt: skip
        drafts.add(on["speculation"]["num_draft_tokens"], on["speculation"]["num_accepted_tokens"])
        chat = isinstance(prompt, ChatPrompt)
        keys, _ = _keys_and_top(on["choices"][0], chat)
        _, top = _keys_and_top(off["choices"][0], chat)
        results.append(greedy_prompt(prompt.id, on["choices"][0]["token_ids"],
                                     off["choices"][0]["token_ids"], top, tolerance, strict,
                                     speculative_keys=keys))  # fmt: skip
    return results, drafts


def _sample_request(
    client: ServerClient, route: str, body: dict[str, Any]
) -> tuple[list[tuple[int, int]], int, DraftCounts]:
    """One streamed request of n choices, closed once each has two tokens: each choice's first
    two tokens, how many second tokens came from a step that verified drafts, the drafts."""
    n = body["n"]
    tokens: dict[int, list[int]] = {i: [] for i in range(n)}
    verified, drafts = 0, DraftCounts()
    events = client.stream(route, body)
    try:
        for event in events:
            for choice in event["choices"]:
                had = tokens[choice["index"]]
                if len(had) >= 2 or not choice.get("token_ids"):
                    continue
                had += choice["token_ids"]
                step = choice.get("speculation") or {}
                if len(had) >= 2 and step.get("num_draft_tokens"):
                    verified += 1
                    drafts.add(step["num_draft_tokens"], step["num_accepted_tokens"])
            if all(len(t) >= 2 for t in tokens.values()):
                break
    finally:
        events.close()
    if not all(len(t) >= 2 for t in tokens.values()):
        raise ServerError(0, "a sampling request ended before two tokens (is the prompt too "
                          "long for the server's context?)")  # fmt: skip
    return [(t[0], t[1]) for t in tokens.values()], verified, drafts


def sample_requests(
    prompt: BenchPrompt, params: SamplingParams, n: int, seed: int, drafting: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The requests that draw n samples of a prompt's first two tokens: every other request
    seeded (seed + its first sample's index; the server seeds choice j with its seed + j, and
    verifies by coupling), the rest unseeded (rejection sampling), so both verifiers are
    checked (docs/design.md, 3). drafting: the requests' "speculative" switch."""
    route, body = _body(prompt)
    body |= {"temperature": params.temperature, "top_p": params.top_p, "ignore_eos": True,
             "max_tokens": SAMPLE_MAX_TOKENS, "return_token_ids": True,
             "speculative": drafting}  # fmt: skip
    if params.top_k > 0:
        body["top_k"] = params.top_k
    return [(route, {**body, "n": min(MAX_N, n - start),
                     **({"seed": seed + start} if start // MAX_N % 2 == 0 else {})})
            for start in range(0, n, MAX_N)]  # fmt: skip


def sampling_check(
    client: ServerClient,
    prompts: Sequence[BenchPrompt],
    params: SamplingParams,
    samples: int,
    seed: int,
    alpha: float,
) -> tuple[list[SamplingPrompt], DraftCounts]:
    """Per prompt, `samples` speculative and `samples` plain draws of the first two tokens
    (disjoint seeds, requests interleaved), compared at alpha / prompts (Bonferroni)."""
    threshold = alpha / len(prompts)
    jobs: list[tuple[str, dict[str, Any]]] = []
    for i, prompt in enumerate(prompts):
        on = sample_requests(prompt, params, samples, seed + 2 * i * samples, True)
        off = sample_requests(prompt, params, samples, seed + (2 * i + 1) * samples, False)
        jobs += [job for pair in zip(on, off, strict=True) for job in pair]
    with ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        answers = list(pool.map(lambda job: _sample_request(client, *job), jobs))
    per_prompt = len(jobs) // len(prompts)
    results, total = [], DraftCounts()
    for i, prompt in enumerate(prompts):
        sides: list[Counter[Hashable]] = [Counter(), Counter()]
        verified = [0, 0]
        for j, (pairs, v, d) in enumerate(answers[i * per_prompt : (i + 1) * per_prompt]):
            sides[j % 2].update(pairs)
            verified[j % 2] += v
            if j % 2 == 0:
                total.add(d.drafted, d.accepted)
        if verified[1]:
            raise ServerError(0, "the server verified drafts for a request with speculative: "
                              "false; it does not honour the switch")  # fmt: skip
        comparison = compare(sides[0], sides[1], delta=threshold)
        results.append(two_sample_prompt(prompt.id, comparison, verified[0], threshold))
    return results, total
