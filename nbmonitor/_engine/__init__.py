"""SAMPLER THREAD: the engine (numpy only). See README.md beside this file."""
