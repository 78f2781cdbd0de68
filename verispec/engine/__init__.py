"""The step loop: engine (the step), scheduler, runner, request (a sequence's state), the
prefill pace, and drafter (the contract every drafter meets; the engine is handed one built).
Import the modules themselves: this file imports nothing, so any of them loads first."""
