"""Seeded perturbations of a model's weights, as evolution strategies apply them.

- :mod:`~esrepro.perturb.noise`: a member's noise, a pure function of (run seed, iteration, member, tensor);
- :mod:`~esrepro.perturb.ops`: perturb, restore and update a list of tensors in place, tensor by tensor;
- :mod:`~esrepro.perturb.weights`: one engine's copy of the weights under those operations, with checksums;
- :mod:`~esrepro.perturb.lowrank`: low-rank (EGGROLL) noise, A Bᵀ / √r per weight matrix, and its update;
- :mod:`~esrepro.perturb.adapter`: a low-rank member as a peft LoRA adapter (what a multi-LoRA engine serves).

It sits below the engines that apply it (:mod:`esrepro.backends`, :mod:`esrepro.essa`) and the ES loop that
asks for it (:mod:`esrepro.es`).
"""
