"""The plumbing every stage runs on, below the tasks and the models.

- :mod:`~esrepro.runtime.forkserver`: a preloaded interpreter that local jobs are forked from;
- :mod:`~esrepro.runtime.lifeline`: helper processes that die with the process they serve;
- :mod:`~esrepro.runtime.distributed`: the process group of a multi-process job;
- :mod:`~esrepro.runtime.devices`: which device a job runs on and where its noise is drawn;
- :mod:`~esrepro.runtime.numerics`: portable numerics (thread counts, square roots, AdamW) that keep a tiny run
  bit-identical across x86-64 CPUs.
"""
