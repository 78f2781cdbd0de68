"""Scale-out on Ray Serve: N replicas of the server, each with its own engine, behind Ray
Serve's HTTP proxy and router (an existing engine, not a home-made balancer). Needs the
`scale` extra (`pip install -e ".[scale]"`, Ray Serve); see docs/scale-out.md.

    from ray import serve
    from verispec.serve.scale_out import tier
    serve.run(tier("latency", "embedded-code", "auto", num_replicas=2), route_prefix="/latency")

A replica is the same FastAPI app `verispec serve` runs (`create_app` over an `AsyncEngine`),
built on the replica by Ray Serve's ingress builder, so every route, field, error and metric of
docs/serving.md holds behind the proxy; Ray Serve spreads requests over replicas.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

TIERS = {"latency": "auto", "throughput": None}
"""The example deployment's tiers: speculation adaptive (latency) or off (throughput)."""


def replica_app(
    name: str, model: str | None, speculative: Any, threads: int, options: dict[str, Any]
) -> FastAPI:
    """One replica's API: loads its own engine, starts its engine thread, returns the app."""
    import torch

    from verispec import LLM
    from verispec.serve.api import create_app
    from verispec.serve.async_engine import AsyncEngine
    from verispec.serve.metrics import ServerMetrics

    torch.set_num_threads(threads)
    llm = LLM(model=model, speculative=speculative, **options)
    engine = AsyncEngine(llm.engine, ServerMetrics(name))
    engine.start()
    return create_app(engine, name)


def tier(
    name: str,
    model: str | None,
    speculative: Any,
    num_replicas: int = 1,
    threads: int = 1,
    **engine_options: Any,
) -> Any:
    """A Ray Serve application of num_replicas replicas serving `model` as `name`, each on
    `threads` CPUs (speculative: "auto", None, a SpecConfig or its dict form)."""
    from ray import serve

    if num_replicas < 1 or threads < 1:
        raise ValueError(f"num_replicas and threads must be >= 1, got {num_replicas}, {threads}")
    def build() -> FastAPI:  # a plain function: Ray Serve runs it on each replica
        return replica_app(name, model, speculative, threads, engine_options)

    deployment = serve.deployment(
        serve.ingress(build)(), name=name, num_replicas=num_replicas,
        ray_actor_options={"num_cpus": threads},
    )  # fmt: skip
    return deployment.bind()
