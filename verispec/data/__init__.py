"""Data the package reads at run time and no model computes: the source corpus (drafters,
training and the bench read it); it imports nothing else of verispec."""
