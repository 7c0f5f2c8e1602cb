"""What a random-weight replica keeps of a real hub model: its family's special tokens, chat template and end-of-
sequence semantics, and the config semantics of its size (rope, context length, tied embeddings).

The facts are those of the hub repositories' ``config.json``, ``generation_config.json`` and
``tokenizer_config.json`` (Qwen2.5 instruct and base, Qwen2.5-Math, Llama 3.1 and 3.2); only the structure
(width, depth, vocabulary) is scaled down.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: The scaled-down structure of every replica. vLLM's CPU attention refuses heads of 16 dimensions: 4 heads of 32
#: (2 key-value heads, grouped-query attention as the real models have) is the smallest shape it runs.
STRUCTURE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2}

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
#: Added tokens Qwen2.5 does not mark special.
QWEN_PLAIN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]

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

# Pre-tokenizer patterns: Qwen2 splits digits one by one, Llama 3 in runs of up to three.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Facts:
    """One real model's semantics that its replica keeps."""

    family: str                       # qwen2 | llama
    instruct: bool
    architecture: str                 # the transformers class in config.json
    config: dict[str, Any]            # config.json keys beyond the scaled structure and the token ids
    specials: list[str]               # special tokens, in the real id order, after the BPE vocabulary
    plain_added: list[str] = field(default_factory=list)
    eos_token: str = ""               # tokenizer_config's eos
    bos_token: str | None = None
    pad_token: str | None = None
    config_eos: list[str] = field(default_factory=list)       # config.json eos_token_id
    generation_eos: list[str] = field(default_factory=list)   # generation_config.json eos_token_id
    generation: dict[str, Any] = field(default_factory=dict)  # its sampling defaults
    chat_template: str | None = None
    tokenizer_class: str = ""
    split_pattern: str = ""
    add_bos: bool = False             # the tokenizer itself prepends bos
    pad_vocab_to: int = 1             # config vocab_size rounded up to this multiple (Qwen pads its embedding)


def _size_b(size: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([BM])\s*", size or "")
    if not m:
        raise ValueError(f"registry size {size!r} is not a number of parameters such as 7B")
    return float(m.group(1)) * (1.0 if m.group(2) == "B" else 1e-3)


def facts_for(hub_id: str, family: str, size: str) -> Facts:
    """The facts of the real model ``hub_id`` (family ``qwen2`` or ``llama``, registry ``size``)."""
    name = hub_id.split("/")[-1].lower()
    instruct = "instruct" in name
    if family == "qwen2":
        return _qwen(name, instruct, _size_b(size))
    if family == "llama":
        return _llama(name, instruct)
    raise ValueError(f"{hub_id}: no replica facts for family {family!r} (known: qwen2, llama)")


def _qwen(name: str, instruct: bool, billions: float) -> Facts:
    math = "math" in name
    if math:
        context, theta = 4096, 10000.0
    else:
        context, theta = (32768 if instruct else 131072), 1000000.0
    config = {"max_position_embeddings": context, "rope_theta": theta, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": billions < 5, "use_sliding_window": False, "sliding_window": context,
              "max_window_layers": STRUCTURE["num_hidden_layers"], "hidden_act": "silu",
              "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True}
    eos = "<|im_end|>" if instruct else "<|endoftext|>"
    if instruct:
        generation = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                      "repetition_penalty": 1.05 if billions >= 7 else 1.1}
        generation_eos = ["<|im_end|>", "<|endoftext|>"]
    else:
        generation = {"do_sample": False, "max_new_tokens": 2048}
        generation_eos = ["<|endoftext|>"]
    system = QWEN_MATH_SYSTEM if math else QWEN_SYSTEM
    return Facts(family="qwen2", instruct=instruct, architecture="Qwen2ForCausalLM", config=config,
                 specials=QWEN_SPECIALS, plain_added=QWEN_PLAIN_ADDED, eos_token=eos, pad_token="<|endoftext|>",
                 config_eos=[eos], generation_eos=generation_eos, generation=generation,
                 chat_template=QWEN_TEMPLATE.replace("SYSTEM", system), tokenizer_class="Qwen2Tokenizer",
                 split_pattern=QWEN_SPLIT, pad_vocab_to=64)


def _llama(name: str, instruct: bool) -> Facts:
    v31 = "3.1" in name
    rope_scaling = {"factor": 8.0 if v31 else 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    config = {"max_position_embeddings": 131072, "rope_theta": 500000.0, "rope_scaling": rope_scaling,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": not v31, "hidden_act": "silu",
              "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
              "initializer_range": 0.02, "use_cache": True}
    eos_all = ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
    return Facts(family="llama", instruct=instruct, architecture="LlamaForCausalLM", config=config,
                 specials=LLAMA_SPECIALS, eos_token="<|eot_id|>" if instruct else "<|end_of_text|>",
                 bos_token="<|begin_of_text|>", config_eos=eos_all if instruct else ["<|end_of_text|>"],
                 generation_eos=eos_all if instruct else ["<|end_of_text|>"],
                 generation={"do_sample": True, "temperature": 0.6, "top_p": 0.9},
                 chat_template=LLAMA_TEMPLATE if instruct else None, tokenizer_class="PreTrainedTokenizerFast",
                 split_pattern=LLAMA_SPLIT, add_bos=True)
