"""Models: loading registry entries and building the tiny default model."""
