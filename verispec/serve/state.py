"""ServerState: what the API's routes share (serve/api.py, serve/prompts.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verispec.serve.async_engine import AsyncEngine
from verispec.serve.limits import ServerLimits
from verispec.serve.template_workers import TemplateWorkers


@dataclass(slots=True)
class ServerState:
    """What the routes share: the engine, the names the model answers to, the limits on one
    request, and the workers rendering requests' own templates (when trusted)."""

    engine: AsyncEngine
    model_name: str
    created: int
    limits: ServerLimits
    templates: TemplateWorkers | None

    @property
    def tokenizer(self) -> Any:
        return self.engine.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len
