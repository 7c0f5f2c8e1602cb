"""Generation backends: ``hf`` (transformers, CPU or GPU); ``vllm`` on GPU machines."""

from esrepro.backends.base import Backend

__all__ = ["Backend"]
