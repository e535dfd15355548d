"""Figures derived from the stores on the sampler thread (progress, energy): numpy only."""
