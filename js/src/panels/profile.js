// The profile table (anywidget ESM): a status line while mon.profile() waits and records, then
// torch.profiler's key_averages as a sortable table (click a column to sort by it).

import { LayerTable } from "./table.js";

/** @param {string} tag @param {string} [className] @param {string} [text] */
function h(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** @param {{ model: any, el: HTMLElement }} ctx */
function render({ model, el }) {
  const root = h("div", "nbm-root nbm-profile");
  const title = h("div", "nbm-section-title");
  const status = h("div", "nbm-note nbm-profile-status");
  const error = h("div", "nbm-alert nbm-sev-error nbm-profile-error");
  const trace = h("div", "nbm-note nbm-profile-trace");
  root.append(title, status, error, trace);
  el.append(root);
  /** @type {LayerTable | null} */
  let table = null;

  const draw = () => {
    const rows = model.get("rows") ?? [];
    title.textContent = model.get("title") ?? "";
    title.hidden = !title.textContent;
    status.textContent = model.get("status") ?? "";
    status.hidden = !status.textContent;
    error.textContent = model.get("error") ?? "";
    error.hidden = !error.textContent;
    const path = model.get("trace_path") ?? "";
    trace.textContent = path ? `trace: ${path} (open in ui.perfetto.dev)` : "";
    trace.hidden = !path;
    if (rows.length && !table) table = new LayerTable(root, model.get("columns") ?? []);
    if (table) table.update(rows);
  };

  const events = ["rows", "title", "status", "error", "trace_path"].map((t) => `change:${t}`);
  for (const event of events) model.on(event, draw);
  draw();
  return () => {
    for (const event of events) model.off(event, draw);
    table?.destroy();
    root.remove();
  };
}

export default { render };
