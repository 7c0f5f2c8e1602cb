"""ESSA (Korotyshova et al., arXiv 2507.04453): LoRA SFT, an SVD of every adapter, and
CMA-ES over the adapters' top singular values.

- ``lora``: LoRA SFT on the attention projections (TRL + peft); reading adapters back.
- ``svd``: the singular value search space, and applying a candidate in place (merged
  weights, or an unmerged adapter on a quantised base).
- ``strategy``: separable CMA-ES as ask/tell with an exactly resumable state.
- ``export``: a candidate as a peft adapter or as merged transformers weights.
- ``data``: the SFT / fitness / held-out split of a run's problems, SFT targets, the draw per generation.
- ``engine``: an engine holding the SFT model (precision native, int8, int4) for the population evaluator.
- ``loop``: the CMA-ES loop over a population evaluator, resumable bit for bit.
- ``train``: the ``essa`` trainer (``Algorithm.trainer``): SFT cache, loop, run directory.
- ``baseline``: the ESSA study's GRPO baseline from the reference run's SFT start (verb ``essa-grpo``).
"""
