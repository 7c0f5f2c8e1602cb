"""The tokenizer saved in this folder, exactly as its tokenizer.json defines it.

transformers' AutoTokenizer loads a folder whose config.json is a qwen2 one through Qwen2's tokenizer class, whose own
pre-tokenizer replaces the one in tokenizer.json and splits text into other tokens than the model was trained on. The
folder's tokenizer_config.json names this class in its auto_map, so AutoTokenizer.from_pretrained(folder) loads
tokenizer.json as saved, with or without trust_remote_code=True (without it, transformers takes the
tokenizer_class, TokenizersBackend, instead of this module: the same tokenizer). Written by esrepro.models.loading.
"""

from transformers import PreTrainedTokenizerFast


class SavedTokenizer(PreTrainedTokenizerFast):
    """tokenizer.json's normalizer, pre-tokenizer, model and decoder, unchanged."""
