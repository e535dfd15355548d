"""Where are we running, and how to put a view on screen.

Kept free of widget libraries so the engine can ask ``in_notebook()`` cheaply in a plain script.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nbmonitor.ui.dashboard import Dashboard


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Notebook, VS Code, Colab), False elsewhere.

    Terminal IPython is not a notebook: it cannot render widgets, so it gets the console view.
    """
    # IPython is only ever loaded by a kernel or a shell: if it is absent we are in a plain
    # interpreter, and importing it here would cost ~100 ms for nothing.
    if "IPython" not in sys.modules:
        return False
    try:
        from IPython.core.getipython import get_ipython
    except ImportError:  # pragma: no cover - IPython half-installed
        return False
    # IPython 9 annotates get_ipython, 8 does not: the ignore must not be flagged with either.
    shell = get_ipython()  # type: ignore[no-untyped-call, unused-ignore]
    if shell is None:
        return False
    # Colab and other hosted kernels subclass ZMQInteractiveShell; the kernel app in the config
    # catches shells that do not (for example, a kernel started with a custom shell class).
    if any(cls.__name__ == "ZMQInteractiveShell" for cls in type(shell).__mro__):
        return True
    config = getattr(shell, "config", None)
    return bool(config is not None and "IPKernelApp" in config)


def show(dashboard: Dashboard) -> None:
    """Display ``dashboard`` in the current cell's output. Main thread only (the kernel's rule).

    The output gets a display id, handed to the dashboard (``on_displayed``), so that it can
    refresh its static fallback in place when the run closes: a saved or nbconvert'ed notebook
    then shows the final numbers rather than those at attach time.
    """
    from IPython.display import display

    handle = display(dashboard, display_id=True)  # type: ignore[no-untyped-call]
    if handle is not None:
        dashboard.on_displayed(handle)
