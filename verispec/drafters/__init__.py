"""Drafters: the Proposer protocol, its registry, and one module per method."""
