"""esrepro: reproduction pipeline for evolution-strategies fine-tuning of LLMs."""

__version__ = "0.1.0"
