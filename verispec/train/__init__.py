"""Training: tokenizers and models the project makes itself."""
