"""`verispec verify`: checks that speculative decoding of a configuration is exact, against plain
decoding of the same target (docs/verify.md): fit.py (the statistics), distribution.py (the
target's exact distribution of the first two tokens), report.py (evidence, verdict rules, text
and JSON), local_check.py (a local engine), client.py and server_check.py (a running server)."""
