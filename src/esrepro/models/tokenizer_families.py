"""What a random-weight replica's tokenizer keeps of a real hub model: its special tokens, chat template, end-of-
sequence semantics and pre-tokenizer, chosen by the model's config ``model_type`` (:func:`facts_for`).

The replica's config comes from the registry entry's own config (:func:`esrepro.planning.rehearsal_registry.replica_config`);
only the tokenizer facts are kept here, and by family only where a family's tokenizer is documented to behave
differently from a generic byte-level BPE (Qwen's and Llama 3's: their facts are those of the hub repositories'
``tokenizer_config.json`` and ``generation_config.json``, Qwen2.5 instruct and base, Qwen2.5-Math, Llama 3.1 and
3.2). Every other model type gets :func:`generic` facts.

Data without imports: the rehearsal bounds (planning) and the rehearsal's replicas read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The scaled-down structure of every replica. vLLM's CPU attention refuses heads of 16 dimensions: 4 heads of 32
#: (2 key-value heads, grouped-query attention as the real models have) is the smallest shape it runs.
STRUCTURE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2}
#: A replica tokenizer's BPE vocabulary before the special tokens: the 256 byte symbols and about a hundred merges
#: (:mod:`esrepro.rehearsal.replica_tokenizer` trains exactly this many on its fixed text); the specials follow.
BPE_VOCAB = 384
#: A model this large or larger counts as "large" for :attr:`Facts.generation_large`.
LARGE_PARAMS = 5e9

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
#: Added tokens Qwen2.5 does not mark special.
QWEN_PLAIN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
#: A generic replica's specials (every model type without its own facts): begin, end and padding.
GENERIC_SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

#: Qwen2.5's chat markup: a default system turn when the conversation has none.
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set rest = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nSYSTEM<|im_end|>\\n' }}"
    "{%- set rest = messages %}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: Llama 3.1's chat markup: bos, a system header with the knowledge cut-off and date, turns ending in eot.
LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- set rest = messages %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message + '<|eot_id|>' }}"
    "{%- for message in rest %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

#: A generic replica's chat markup (an entry with ``chat_template: true`` and no family facts): each turn its role
#: and content, ended by eos; the generation prompt opens the assistant's turn.
GENERIC_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)

# Pre-tokenizer patterns: Qwen2 splits digits one by one, Llama 3 in runs of up to three; the generic one is
# GPT-2's (byte-level BPE's usual split: contractions, letters, digit runs, other symbols, spaces).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GENERIC_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


@dataclass(frozen=True)
class Facts:
    """The tokenizer and generation semantics a replica keeps of one real model, and how its repository lays out
    the tokenizer files."""

    kind: str                         # whose facts: a family's (documented to differ) or "generic"
    instruct: bool
    specials: list[str]               # special tokens, in the real id order, after the BPE vocabulary
    plain_added: list[str] = field(default_factory=list)
    eos_token: str = ""               # tokenizer_config's eos
    bos_token: str | None = None      # tokenizer_config's bos (None: it names none)
    pad_token: str | None = None
    config_bos: str = ""              # the token whose id config.json and generation_config.json give as bos
    config_eos: list[str] = field(default_factory=list)       # config.json eos_token_id
    generation_eos: list[str] = field(default_factory=list)   # generation_config.json eos_token_id
    generation: dict[str, Any] = field(default_factory=dict)  # its sampling defaults
    generation_large: dict[str, Any] = field(default_factory=dict)  # over them, for LARGE_PARAMS or more
    chat_template: str | None = None
    tokenizer_class: str = ""
    split_pattern: str = ""
    add_bos: bool = False             # the tokenizer itself prepends bos
    pad_vocab_to: int = 1             # config vocab_size rounded up to this multiple (Qwen pads its embedding)
    nfc: bool = False                 # an NFC normaliser before the pre-tokenizer
    vocab_files: bool = False         # the repository carries vocab.json and merges.txt beside tokenizer.json
    special_tokens_map: bool = False  # the repository carries special_tokens_map.json
    tokenizer_config: dict[str, Any] = field(default_factory=dict)  # tokenizer_config.json keys beyond the shared
    original_folder: bool = False     # the repository carries a consolidated checkpoint under original/


def facts_for(hub_id: str, model_type: str, chat_template: bool = False) -> Facts:
    """The tokenizer facts of the real model ``hub_id``: by its config's ``model_type`` where a family's tokenizer
    is documented to differ (:data:`FAMILY_FACTS`), else :func:`generic` (a chat template when the registry entry
    says ``chat_template: true``)."""
    name = hub_id.split("/")[-1].lower()
    family = FAMILY_FACTS.get(model_type)
    if family is not None:
        return family(name)
    return generic(chat_template)


def _qwen(name: str) -> Facts:
    """Qwen2/Qwen3's byte-level BPE (``Qwen2Tokenizer``): digits split one by one, an NFC normaliser, ChatML turns
    (``<|im_start|>``/``<|im_end|>``) with a default system turn, eos ``<|im_end|>`` for the post-trained models and
    ``<|endoftext|>`` (also the pad) for the base ones, the embedding padded to a multiple of 64, vocab.json and
    merges.txt in the repository. Post-trained: Qwen2.5's ``-Instruct`` models; Qwen3 names its base models
    ``-Base`` and its post-trained ones without a suffix. Qwen2.5's instruct models of 7B and more ship a lower
    repetition penalty."""
    instruct = "instruct" in name or (name.startswith("qwen3") and "base" not in name)
    eos = "<|im_end|>" if instruct else "<|endoftext|>"
    if instruct:
        generation = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}
        large = {"repetition_penalty": 1.05}
        generation_eos = ["<|im_end|>", "<|endoftext|>"]
    else:
        generation, large = {"do_sample": False, "max_new_tokens": 2048}, {}
        generation_eos = ["<|endoftext|>"]
    system = QWEN_MATH_SYSTEM if "math" in name else QWEN_SYSTEM
    config = {"add_bos_token": False, "add_prefix_space": False, "errors": "replace", "pad_token": "<|endoftext|>",
              "split_special_tokens": False, "unk_token": None,
              "additional_special_tokens": [t for t in QWEN_SPECIALS if t != "<|endoftext|>"]}
    return Facts(kind="qwen", instruct=instruct, specials=QWEN_SPECIALS, plain_added=QWEN_PLAIN_ADDED, eos_token=eos,
                 pad_token="<|endoftext|>", config_bos="<|endoftext|>", config_eos=[eos],
                 generation_eos=generation_eos, generation=generation, generation_large=large,
                 chat_template=QWEN_TEMPLATE.replace("SYSTEM", system), tokenizer_class="Qwen2Tokenizer",
                 split_pattern=QWEN_SPLIT, pad_vocab_to=64, nfc=True, vocab_files=True, tokenizer_config=config)


def _llama3(name: str) -> Facts:
    """Llama 3's tiktoken-style BPE (a ``PreTrainedTokenizerFast``): digits in runs of up to three, bos
    ``<|begin_of_text|>`` prepended by the tokenizer itself, header-delimited chat turns ending in ``<|eot_id|>``
    (the instruct models' eos, beside ``<|end_of_text|>`` and ``<|eom_id|>`` in their configs), and Meta's
    ``original/`` consolidated checkpoint in the repository. Every ``llama`` model type gets these facts (the
    registry's Llama models are Llama 3.1 and 3.2)."""
    instruct = "instruct" in name
    eos_all = ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
    return Facts(kind="llama3", instruct=instruct, specials=LLAMA_SPECIALS,
                 eos_token="<|eot_id|>" if instruct else "<|end_of_text|>", bos_token="<|begin_of_text|>",
                 config_bos="<|begin_of_text|>", config_eos=eos_all if instruct else ["<|end_of_text|>"],
                 generation_eos=eos_all if instruct else ["<|end_of_text|>"],
                 generation={"do_sample": True, "temperature": 0.6, "top_p": 0.9},
                 chat_template=LLAMA_TEMPLATE if instruct else None, tokenizer_class="PreTrainedTokenizerFast",
                 split_pattern=LLAMA_SPLIT, add_bos=True, special_tokens_map=True,
                 tokenizer_config={"model_input_names": ["input_ids", "attention_mask"]}, original_folder=True)


def generic(chat_template: bool = False) -> Facts:
    """A generic replica tokenizer (every model type without family facts): byte-level BPE with GPT-2's split,
    :data:`GENERIC_SPECIALS` after the BPE vocabulary, eos ``<|eos|>`` (config and generation config alike),
    bos ``<|bos|>`` not prepended, pad ``<|pad|>``, and :data:`GENERIC_TEMPLATE` only with ``chat_template``."""
    return Facts(kind="generic", instruct=chat_template, specials=GENERIC_SPECIALS, eos_token="<|eos|>",
                 bos_token="<|bos|>", pad_token="<|pad|>", config_bos="<|bos|>", config_eos=["<|eos|>"],
                 generation_eos=["<|eos|>"],
                 chat_template=GENERIC_TEMPLATE if chat_template else None, tokenizer_class="PreTrainedTokenizerFast",
                 split_pattern=GENERIC_SPLIT, special_tokens_map=True,
                 tokenizer_config={"model_input_names": ["input_ids", "attention_mask"], "pad_token": "<|pad|>"})


#: The config ``model_type``s whose tokenizers are documented to differ from the generic one, and their facts:
#: Qwen2 and Qwen3 share Qwen's tokenizer (same vocabulary, specials and ChatML markup); ``llama`` is Llama 3's.
FAMILY_FACTS = {"qwen2": _qwen, "qwen3": _qwen, "llama": _llama3}
