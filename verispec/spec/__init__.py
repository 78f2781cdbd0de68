"""Speculation's own logic, apart from the engine that runs it and the drafters that propose:
the acceptance and step-cost model (cost.py) that the adaptive policy, self-speculation's
calibration and the benchmarks share, the adaptive policy that chooses each step's draft
counts from it (policy.py), and the start-up profiles of target steps that seed its costs
(profiles.py). Imports nothing here, so any of its modules loads alone."""
