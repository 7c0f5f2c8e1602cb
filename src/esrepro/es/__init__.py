"""Evolution strategies on full parameters: the ES strategy (rewards to update weights), the resumable loop and
the training step; the seeded noise and in-place operations it applies are :mod:`esrepro.perturb`'s."""
