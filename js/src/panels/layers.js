// The layers panel: per-layer gradient norms as a layers x steps heatmap (full layer names,
// a tooltip on each), and the sortable table of the latest value per parameter.

import { decode, shapeOf } from "../codec.js";
import { Heatmap } from "../charts/heatmap.js";
import { LayerTable } from "./table.js";

export const TITLE = "Per-layer gradients (log10 norm, layers \u00d7 steps)";

/**
 * The heatmap's input from a {names, grid, steps} state.
 * @param {Record<string, any>} state
 */
export function heatmapData(state) {
  const [rows, cols] = shapeOf(state?.grid);
  const values = decode(state?.grid);
  const complete = rows > 0 && cols > 0 && values.length === rows * cols;
  return {
    values: complete ? values : new Float32Array(0),
    rows: complete ? rows : 0,
    cols: complete ? cols : 0,
    names: Array.isArray(state?.names) ? state.names.map(String) : [],
    steps: decode(state?.steps),
  };
}

export default {
  name: "layers",
  title: "Layers",
  /** @param {HTMLElement} el */
  create(el) {
    const box = document.createElement("div");
    box.className = "nbm-layers";
    const title = document.createElement("div");
    title.className = "nbm-section-title";
    title.textContent = TITLE;
    box.append(title);
    const heatmap = new Heatmap(box);
    const table = new LayerTable(box);
    el.append(box);
    return {
      /** @param {Record<string, any>} state */
      update(state) {
        const data = heatmapData(state);
        if (!data.names.length) return false;
        heatmap.draw(data);
        const rows = Array.isArray(state.table) ? state.table : [];
        table.table.hidden = rows.length === 0;
        table.update(rows);
        return true;
      },
      destroy() {
        heatmap.destroy();
        table.destroy();
        box.remove();
      },
    };
  },
};
