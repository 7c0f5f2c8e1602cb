"""Planning: what a config asks for, where it runs, what it costs and whether it fits, before any job starts.

The modules answer one question each, in one direction (each imports only those before it; tests/test_imports.py
holds the order, docs/architecture.md walks one setting through it):

- :mod:`~esrepro.planning.plan`, :mod:`~esrepro.planning.jobs`, :mod:`~esrepro.planning.claim_plan`: which runs,
  jobs and claim targets the config makes;
- :mod:`~esrepro.planning.cluster`: where each job runs (resources, nodes, processes, launcher);
- :mod:`~esrepro.planning.checks`: whether the config's cross-references hold;
- :mod:`~esrepro.planning.rehearsal_registry`, :mod:`~esrepro.planning.rehearsal_bounds`: how a paper config is
  bounded for a rehearsal on CPUs;
- :mod:`~esrepro.planning.load`: the above in order, a config and registry read into a checked pipeline;
- :mod:`~esrepro.planning.scaling`, :mod:`~esrepro.planning.job_time`, :mod:`~esrepro.planning.cost`,
  :mod:`~esrepro.planning.resume_cost`, :mod:`~esrepro.planning.claim_cost`: what each job and claim costs;
- :mod:`~esrepro.planning.rl_memory`, :mod:`~esrepro.planning.plan_check`: whether each GPU job fits (over the
  memory model, :mod:`esrepro.models.memory`, which the runs read too);
- :mod:`~esrepro.planning.specs`, :mod:`~esrepro.planning.notes`, :mod:`~esrepro.planning.preflight`: a job's
  arguments, the tables' notes, and what a job needs installed.

The runs (settings, training, engines, tasks) never import this package; it never imports the rehearsal.
"""
