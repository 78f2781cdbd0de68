"""Scale-out on Ray Serve: two replicas of the server behind Ray Serve's HTTP proxy, traffic
through the proxy with the openai client; both replicas run, every answer is the one a single
engine gives. Skips when Ray Serve is not installed (the `scale` extra)."""

from __future__ import annotations

import concurrent.futures
import socket

import pytest

ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install -e '.[scale]')")
serve = pytest.importorskip("ray.serve")

import openai  # noqa: E402

from verispec import LLM, SamplingParams  # noqa: E402
from verispec.serve.scale_out import tier  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_replicas_behind_the_proxy_answer_like_one_engine(chat_pair) -> None:
    target = str(chat_pair[0])
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(tier("tiny", target, None, num_replicas=2, batch_invariant=True),
                  name="tiny", route_prefix="/tiny")  # fmt: skip
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/tiny/v1", api_key="x",
                               max_retries=0)  # fmt: skip
        prompts = [f"def f{i}(x):" for i in range(12)]

        def ask(prompt: str) -> str:
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                             temperature=0).choices[0].text  # fmt: skip

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(ask, prompts))
        replicas = serve.status().applications["tiny"].deployments["tiny"].replica_states
        assert replicas.get("RUNNING") == 2
    finally:
        serve.shutdown()
        ray.shutdown()
    reference = LLM(model=target, speculative=None, batch_invariant=True)
    params = SamplingParams(temperature=0, max_tokens=8)
    assert answers == [o.text for o in reference.generate(prompts, params)]
