"""trexo: a structured-concurrency (trio) cluster for running LLMs with MLX."""

__version__ = "0.1.0"
