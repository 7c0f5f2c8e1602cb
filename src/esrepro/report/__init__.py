"""Reporting: result tables beside the paper's numbers, and training-curve figures."""
