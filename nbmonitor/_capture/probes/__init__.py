"""The probes: one measurement each, taken on the training thread (see ``base.Probe``).

A new probe is one file here plus one line in ``build_probes`` (``_capture/__init__.py``)."""
