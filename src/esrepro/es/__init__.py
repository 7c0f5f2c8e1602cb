"""Evolution strategies on full parameters: seed-based noise, in-place perturbation,
decomposed update, resumable loop."""
