"""Records to rows and per-layer statistics (sampler thread). See README.md."""
