"""Speculation's own logic, between the drafters and the engine: resolve.py turns any spelling
of a speculative request (None, "auto", a SpecConfig, its dict form, a model's own drafter named
by method, with overrides) into the one fully resolved SpecConfig that runs; the adaptive
policy and the step-cost and acceptance models that choose how much to draft belong here too
(policy.py, cost.py)."""
