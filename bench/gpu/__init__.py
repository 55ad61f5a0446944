"""bench/gpu: one prepared script for one GPU (see README.md)."""
