"""``nbmonitor top``: the terminal app (``app.py``, needs the ``tui`` extra: Textual) and the
tables it shows, which ``--once`` and snapshots print as text (``tables.py``, no terminal
library)."""
