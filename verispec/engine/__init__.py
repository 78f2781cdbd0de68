"""The serving loop: engine (the step), scheduler, runner, request (a sequence's state), the
adaptive speculation policy and its step profiles, stats (acceptance counters and step times).
Import the modules themselves: models import nothing of the engine, and this file imports
nothing, so any of them loads first."""
