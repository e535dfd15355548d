// The ranks panel: a distributed job's ranks x steps heatmap (step time, capped at the 99th
// percentile) and its tables: one row per rank, the newest steps across ranks, the summary.

import { Heatmap } from "../charts/heatmap.js";
import { heatmapData } from "./layers.js";

/** @param {{field: string, title: string, head: string[], rows: string[][]}} spec */
export function textTable(spec) {
  const box = document.createDocumentFragment();
  const title = document.createElement("div");
  title.className = "nbm-section-title";
  title.textContent = spec.title;
  const table = document.createElement("table");
  table.className = "nbm-table nbm-ranks-table";
  table.dataset.field = spec.field;
  const thead = document.createElement("thead");
  const tr = document.createElement("tr");
  for (const h of spec.head ?? []) {
    const th = document.createElement("th");
    th.textContent = h;
    tr.append(th);
  }
  thead.append(tr);
  const tbody = document.createElement("tbody");
  for (const row of spec.rows ?? []) {
    const r = document.createElement("tr");
    for (const cell of row) {
      const td = document.createElement("td");
      td.textContent = String(cell);
      r.append(td);
    }
    tbody.append(r);
  }
  table.append(thead, tbody);
  box.append(title, table);
  return box;
}

export default {
  name: "ranks",
  title: "Ranks",
  /** @param {HTMLElement} el */
  create(el) {
    const box = document.createElement("div");
    box.className = "nbm-ranks";
    const title = document.createElement("div");
    title.className = "nbm-section-title";
    const heat = document.createElement("div");
    heat.append(title);
    const heatmap = new Heatmap(heat);
    const tables = document.createElement("div");
    box.append(heat, tables);
    el.append(box);
    return {
      /** @param {Record<string, any>} state */
      update(state) {
        const data = heatmapData(state?.heat ?? {});
        heat.hidden = data.names.length === 0;
        title.textContent = typeof state?.heat?.title === "string" ? state.heat.title : "";
        if (!heat.hidden) heatmap.draw({ ...data, label: state.heat.label });
        const specs = Array.isArray(state?.tables) ? state.tables : [];
        tables.replaceChildren(...specs.map(textTable));
        return !heat.hidden || specs.length > 0;
      },
      destroy() {
        heatmap.destroy();
        box.remove();
      },
    };
  },
};
