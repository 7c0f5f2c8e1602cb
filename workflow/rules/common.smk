# Shared wildcard constraints and helpers for every rule file.

wildcard_constraints:
    task=r"[a-z0-9_]+",
    model=r"[A-Za-z0-9._-]+",
    method=r"[a-z0-9_.]+",
    seed=r"\d+",
    split=r"[a-z0-9_]+",
    cell=r"[A-Za-z0-9._+-]+",


import json

ENV = "../envs/esrepro.yaml"  # relative to this rules folder


def resources_of(rule_name):
    """Snakemake resources for a rule, read from the model's registry entry."""
    return {
        key: (lambda wildcards, key=key: PLAN.resources(wildcards.model, rule_name)[key])
        for key in PLAN.resource_keys(rule_name)
    }
