"""Sizes below which a metric is undefined. Torch-free, so a driver checks them before it imports the fast paths."""

MIN_SAMPLES = 3  # pairwise distances and their ranks need at least 3 rows
