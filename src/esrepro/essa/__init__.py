"""ESSA (Korotyshova et al., arXiv 2507.04453): LoRA SFT, an SVD of every adapter, and
CMA-ES over the adapters' top singular values.

- ``lora``: LoRA SFT on the attention projections (TRL + peft); reading adapters back.
- ``svd``: the singular value search space, and applying a candidate in place.
- ``strategy``: separable CMA-ES as ask/tell with an exactly resumable state.
- ``export``: a candidate as a peft adapter or as merged transformers weights.
"""
