"""Speculation's own logic, on two layers. Below the engine: cost.py holds the acceptance and
step-cost models that the adaptive policy, self-speculation's calibration and the benchmarks
share; policy.py chooses each step's draft counts from them; profiles.py times the target's
steps at start-up to seed those costs. Above the drafters: resolve.py turns any spelling of a
speculative request (None, "auto", a SpecConfig, its dict form, a model's own drafter named by
method, with overrides) into the one ResolvedSpec that runs."""
