"""The dashboard's front end in a bare page, without Jupyter: the built ESM and CSS served on
127.0.0.1, a stand-in anywidget model, and a widget state taken from a real ``Dashboard``
(its traits as ipywidgets would send them: JSON with binary buffers at their paths). Used by
the per-panel screenshot comparison and by ``benchmarks/frame_time.py``."""

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
STATIC = ROOT / "nbmonitor" / "static"

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<link rel="stylesheet" href="widget.css">
<style>body { margin: 8px; background: #fff; } #root { width: 1000px; }</style></head>
<body><div id="root"></div>
<script type="module">
import widget from "./widget.js";

class Model {
  constructor(state) { this.state = state; this.listeners = new Map(); }
  get(key) { return this.state[key]; }
  set(key, value) {
    this.state[key] = value;
    for (const fn of this.listeners.get(`change:${key}`) ?? []) fn();
  }
  on(event, fn) {
    if (!this.listeners.has(event)) this.listeners.set(event, new Set());
    this.listeners.get(event).add(fn);
  }
  off(event, fn) { this.listeners.get(event)?.delete(fn); }
}

function revive(payload) {
  const state = payload.state;
  for (const [path, b64] of payload.buffers) {
    const raw = atob(b64);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i += 1) bytes[i] = raw.charCodeAt(i);
    let node = state;
    for (const key of path.slice(0, -1)) node = node[key];
    node[path[path.length - 1]] = new DataView(bytes.buffer);
  }
  return state;
}

window.nbmMount = (payload) => {
  window.nbmModel = new Model(revive(payload));
  widget.render({ model: window.nbmModel, el: document.getElementById("root") });
};

// The redraw one refresh costs: the traits are set, then the view's requestAnimationFrame
// callback (where every chart of the changed panels is redrawn) is run and timed.
window.nbmRefreshMs = (payload) => {
  const state = revive(payload);
  const raf = window.requestAnimationFrame;
  let pending = null;
  window.requestAnimationFrame = (fn) => { pending = fn; return 1; };
  try {
    for (const [key, value] of Object.entries(state)) window.nbmModel.set(key, value);
  } finally {
    window.requestAnimationFrame = raf;
  }
  if (!pending) return 0;
  const t0 = performance.now();
  pending(t0);
  return performance.now() - t0;
};
window.nbmReady = true;
</script></body></html>
"""

TRAITS = ("header", "system", "devices", "alerts", "errors", "panels")


def widget_payload(widget: Any, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The widget's synced state as the front end receives it: JSON, buffers base64 by path."""
    from ipywidgets.widgets.widget import _remove_buffers

    names = keys or tuple(k for k in widget.keys if k in TRAITS or k.startswith("panel_"))
    state = widget.get_state(list(names))
    state, paths, buffers = _remove_buffers(state)
    return {
        "state": state,
        "buffers": [
            [path, base64.b64encode(bytes(buf)).decode()]
            for path, buf in zip(paths, buffers, strict=True)
        ],
    }


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_page() -> Iterator[str]:
    """The page and the built front end on 127.0.0.1; yields its URL."""
    if not (STATIC / "widget.js").is_file():
        raise RuntimeError("the front end is not built: run `npm run build` in js/")
    with tempfile.TemporaryDirectory(prefix="nbm-harness-") as tmp:
        for name in ("widget.js", "widget.css"):
            shutil.copy(STATIC / name, Path(tmp) / name)
        (Path(tmp) / "index.html").write_text(PAGE)
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
