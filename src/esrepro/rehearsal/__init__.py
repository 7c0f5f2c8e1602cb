"""The rehearsal of the papers' run on one CPU machine: config/paper.yaml at toy size, offline.

Random-weight replicas of the hub models and copies (or labelled stand-ins) of the remote data files are
served from a local mirror through the same download code paths; the DAG runs under the SLURM profile
against the local cluster (scripts/slurm-local); a report lists every rule with its seconds and work.
"""
