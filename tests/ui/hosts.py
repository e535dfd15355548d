"""A page with a real ipywidgets widget manager, standing in for the notebook hosts that render
widgets outside JupyterLab (VS Code's notebook webview) and for the output frame that receives
only some comm messages (Colab).

What is real here: the widget manager (``@jupyter-widgets/html-manager``, the standalone manager
of ipywidgets 8, with its ``@jupyter-widgets/base`` and controls), requirejs loading third-party
widget modules by name, and those modules as the kernel's environment ships them in
``share/jupyter/nbextensions`` (anywidget, bqplot, bqscales): VS Code's Jupyter extension loads
widget modules exactly so, by requirejs from that folder of the kernel's environment (its
"local" widget script source) or from a CDN. The widget state is what ipywidgets' own
``embed_data`` writes, and each update is the comm message ipywidgets sends (captured where the
widget hands it to the comm), applied through the model's own comm handler
(``WidgetModel._handle_comm_msg``). What is a stand-in: there is no kernel connection; the
messages are fed to the models by the test, in the order the kernel sent them.

Used by tests/ui/test_hosts.py and benchmarks/frame_time.py (bqplot against the canvas charts).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HTML_MANAGER = ROOT / "js" / "node_modules" / "@jupyter-widgets" / "html-manager" / "dist"
REQUIREJS = ROOT / "js" / "node_modules" / "requirejs" / "require.js"
MODULES = ("anywidget", "bqplot", "bqscales")

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<style>body { margin: 8px; background: #fff; } #root { width: 1000px; }</style>
<script src="require.js"></script>
<script>
// Widget modules by name from the environment's nbextensions folder, as VS Code's "local"
// widget script source registers them (requirejs paths, no .js suffix).
requirejs.config({ paths: MODULE_PATHS });
</script>
<script src="html-manager/libembed-amd.js"></script>
</head>
<body><div id="root"></div>
<script>
function bytes(b64) {
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 1) out[i] = raw.charCodeAt(i);
  return new DataView(out.buffer);
}
function frame() { return new Promise((resolve) => requestAnimationFrame(() => resolve())); }

require(["@jupyter-widgets/html-manager", "@jupyter-widgets/html-manager/dist/libembed-amd"],
  (htmlmanager, embed) => {
    const manager = new htmlmanager.HTMLManager({ loader: embed.requireLoader });
    window.hostManager = manager;
    // The state ipywidgets.embed.embed_data writes; the view of model `id` into #root.
    window.hostMount = async (managerState, id) => {
      await manager.set_state(managerState);
      const model = await manager.get_model(id);
      const view = await manager.create_view(model);
      await manager.display_view(view, document.getElementById("root"));
      return true;
    };
    // Comm messages as the kernel sent them: [model_id, data, [base64 buffers]].
    window.hostApply = async (messages) => {
      for (const [id, data, buffers] of messages) {
        const model = await manager.get_model(id);
        await model._handle_comm_msg({ content: { data }, buffers: buffers.map(bytes) });
      }
    };
    // One refresh's frame: the messages handled, then the frame that draws them and the next
    // one's start (every redraw scheduled in requestAnimationFrame, then style, layout and
    // paint, are done by then). Milliseconds.
    window.hostFrameMs = async (messages) => {
      await frame();
      const t0 = performance.now();
      await window.hostApply(messages);
      await frame();
      await frame();
      return performance.now() - t0;
    };
    window.hostReady = true;
  });
</script></body></html>
"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def nbextensions() -> Path:
    """The environment's ``share/jupyter/nbextensions`` holding anywidget's and bqplot's."""
    from jupyter_core.paths import jupyter_path

    for folder in jupyter_path("nbextensions"):
        if all((Path(folder) / m / "index.js").is_file() for m in MODULES):
            return Path(folder)
    raise RuntimeError(f"no nbextensions folder with {', '.join(MODULES)} in jupyter_path()")


@contextlib.contextmanager
def serve_manager_page() -> Iterator[str]:
    """The widget-manager page on 127.0.0.1; yields its URL."""
    if not (HTML_MANAGER / "libembed-amd.js").is_file() or not REQUIREJS.is_file():
        raise RuntimeError("the html-manager is not installed: run `npm ci` in js/")
    source = nbextensions()
    with tempfile.TemporaryDirectory(prefix="nbm-hosts-") as tmp:
        root = Path(tmp)
        shutil.copytree(HTML_MANAGER, root / "html-manager")
        shutil.copy(REQUIREJS, root / "require.js")
        paths = {}
        for module in MODULES:
            shutil.copytree(source / module, root / "nbextensions" / module)
            paths[module] = f"nbextensions/{module}/index"
        import json

        (root / "index.html").write_text(PAGE.replace("MODULE_PATHS", json.dumps(paths)))
        handler = functools.partial(_Quiet, directory=tmp)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def embed_state(widget: Any) -> dict[str, Any]:
    """``{"manager_state": ..., "model_id": ...}``: what ipywidgets embeds for ``widget``."""
    from ipywidgets.embed import embed_data

    # Every trait, as a comm_open carries them (defaults dropped, html-manager fails on the
    # layout model).
    data = embed_data(views=[widget], drop_defaults=False)
    return {"manager_state": data["manager_state"], "model_id": widget.model_id}


class CommRecorder:
    """Records every comm message the widgets send, as ``[model_id, data, [base64 buffers]]``,
    where ipywidgets hands them to the comm (``Widget._send``); a context manager."""

    def __init__(self) -> None:
        self.messages: list[list[Any]] = []
        self._old: Any = None

    def __enter__(self) -> CommRecorder:
        import ipywidgets

        self._old = ipywidgets.Widget._send
        old = self._old
        messages = self.messages

        def send(widget: Any, msg: dict[str, Any], buffers: Any = None) -> None:
            if getattr(widget, "comm", None) is not None:  # none yet while it is built
                encoded = [base64.b64encode(bytes(b)).decode() for b in buffers or ()]
                messages.append([widget.model_id, msg, encoded])
            old(widget, msg, buffers)

        ipywidgets.Widget._send = send
        return self

    def __exit__(self, *exc: object) -> None:
        import ipywidgets

        ipywidgets.Widget._send = self._old

    def take(self) -> list[list[Any]]:
        """The messages recorded since the last take."""
        out = list(self.messages)
        self.messages.clear()
        return out


class MainThreadOnly(CommRecorder):
    """A stand-in for Colab's comm delivery: a message the widgets send from the kernel's main
    thread reaches the front end (recorded, then handed on); one sent from any other thread is
    dropped (counted in ``dropped``), as Colab's output frame never shows an update sent from a
    background thread (see nbmonitor/ui/delivery.py). Only this rule is modelled, not Colab."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def __enter__(self) -> MainThreadOnly:
        import ipywidgets

        super().__enter__()
        record = ipywidgets.Widget._send
        old = self._old

        def send(widget: Any, msg: dict[str, Any], buffers: Any = None) -> None:
            if threading.current_thread() is threading.main_thread():
                record(widget, msg, buffers)
            elif getattr(widget, "comm", None) is not None:
                self.dropped += 1
            else:  # a widget being built: nothing is sent anyway
                old(widget, msg, buffers)

        ipywidgets.Widget._send = send
        return self
