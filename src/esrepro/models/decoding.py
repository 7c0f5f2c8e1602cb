"""One greedy decoding rule for every backend: what of a model's ``generation_config`` applies when decoding greedily.

Both generation backends decode greedily (argmax at every step) and stop at every end-of-sequence
id. Of a model's generation config, only the settings that change the argmax matter then:
sampling settings (temperature, top_p, top_k) do not. The transformers backend applies the
model's generation config through its logits processors; vLLM applies only what its
``SamplingParams`` are given. So that rewards optimised on one backend and accuracy measured on
the other come from one rule, :func:`greedy_rule` reads the settings both apply the same way
(``repetition_penalty``: Qwen2.5-Instruct models ship 1.05 or 1.1) and refuses a model whose
generation config asks for a greedy-changing setting that only one backend would honour.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

#: generation_config fields that change greedy outputs, with the value that leaves them off; vLLM's
#: SamplingParams has no equal of these, so a model that sets one is refused rather than decoded two ways.
UNSUPPORTED: dict[str, Any] = {
    "num_beams": 1,
    "no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "min_length": 0,
    "min_new_tokens": None,
    "guidance_scale": None,
}


@dataclass(frozen=True)
class GreedyRule:
    """The greedy-changing settings every backend applies: HF's ``repetition_penalty`` (logits of tokens already in
    the prompt or the response divided by it when positive, multiplied when negative; vLLM's is the same rule)."""

    repetition_penalty: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        """The rule as recorded in manifests."""
        return {"decoding": "greedy", **asdict(self)}


def greedy_rule(generation_config: Mapping[str, Any] | None, source: str) -> GreedyRule:
    """The greedy rule of a generation config (its ``to_dict()``, or generation_config.json's content; None: defaults).

    Raises ValueError naming ``source`` and the field when the config sets a greedy-changing option that the
    backends would not apply alike (:data:`UNSUPPORTED`).
    """
    config = dict(generation_config or {})
    for field, off in UNSUPPORTED.items():
        value = config.get(field, off)
        if value is not None and value != off:
            raise ValueError(f"{source}: generation config sets {field}={value!r}, which changes greedy decoding and "
                             "which the vLLM backend does not apply; remove it to decode this model by one rule")
    penalty = config.get("repetition_penalty")
    penalty = 1.0 if penalty is None else float(penalty)
    if penalty <= 0:
        raise ValueError(f"{source}: generation config sets repetition_penalty={penalty}, which must be positive")
    return GreedyRule(repetition_penalty=penalty)


def model_greedy_rule(model_dir: str | Path) -> GreedyRule:
    """:func:`greedy_rule` of the checkpoint in ``model_dir`` (its generation_config.json; none: the defaults, as
    transformers derives them from config.json)."""
    import json

    path = Path(model_dir) / "generation_config.json"
    if not path.exists():
        return greedy_rule(None, str(path))
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    return greedy_rule(config, str(path))
