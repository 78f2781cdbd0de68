"""The models users can name: the shipped pair (default.py, its files in models/embedded/) and
named models fetched once into the cache (hub.py)."""
