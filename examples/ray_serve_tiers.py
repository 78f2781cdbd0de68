"""Two tiers of verispec replicas behind Ray Serve's HTTP proxy on this machine: a latency
tier (speculation adaptive) at /latency and a throughput tier (speculation off) at
/throughput, then traffic to both through the proxy with the openai client.

    pip install -e ".[scale]"
    python examples/ray_serve_tiers.py                       # embedded-code, 1 + 1 replicas
    python examples/ray_serve_tiers.py --latency-replicas 2 --throughput-replicas 0

Prints, per tier, its replicas and the requests/s and tokens/s of a few concurrent clients
whose requests went through the proxy (Ray Serve's router spreads them over the replicas).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time

import openai
import ray
from ray import serve

from verispec.serve.scale_out import TIERS, tier


def traffic(base_url: str, model: str, requests: int, clients: int) -> tuple[float, int]:
    """(seconds, output tokens) of `requests` completions from `clients` threads."""
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)

    def one(i: int) -> int:
        out = client.completions.create(model=model, prompt=f"def task_{i}(x):", max_tokens=32,
                                        temperature=0)  # fmt: skip
        return out.usage.completion_tokens

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, range(requests)))
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded-code")
    parser.add_argument("--latency-replicas", type=int, default=1)
    parser.add_argument("--throughput-replicas", type=int, default=1)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    replicas = {"latency": args.latency_replicas, "throughput": args.throughput_replicas}
    ray.init(num_cpus=max(2, sum(replicas.values())), include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        for name, n in replicas.items():
            if n:
                serve.run(tier(name, args.model, TIERS[name], num_replicas=n), name=name,
                          route_prefix=f"/{name}")  # fmt: skip
        for name, n in replicas.items():
            if not n:
                continue
            url = f"http://127.0.0.1:{args.port}/{name}/v1"
            seconds, tokens = traffic(url, name, args.requests, args.clients)
            print(f"{name:>10}: {n} replica(s), {args.requests} requests from {args.clients} "
                  f"clients through Ray Serve's proxy in {seconds:.1f} s: "
                  f"{args.requests / seconds:.2f} requests/s, {tokens / seconds:.1f} tokens/s")
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
