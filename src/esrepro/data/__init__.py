"""Data: downloads with pinned revisions and checksums (task data preparation lives in :mod:`esrepro.tasks`)."""
