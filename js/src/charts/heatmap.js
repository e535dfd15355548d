// Layers x steps heatmap of log10 grad norm on a <canvas>. The matrix arrives as one float32
// buffer (row-major, one row per layer); drawing it as an ImageData of one pixel per cell and
// letting the browser scale it keeps the cost independent of the canvas size.

import { fmtNumber, isNum, middleEllipsis } from "../format.js";

/**
 * A matrix the heatmap draws: `rows` x `cols` values (row-major), a name per row, a step per column.
 * @typedef {{values: Float32Array | Float64Array, rows: number, cols: number, names: string[], steps: Float32Array | Float64Array, label?: string}} HeatmapData
 */

// A perceptual ramp (viridis stops); dark = small gradients, yellow = large.
const STOPS = [
  [68, 1, 84],
  [59, 82, 139],
  [33, 145, 140],
  [94, 201, 98],
  [253, 231, 37],
];

/** @param {number} t in [0, 1] @returns {[number, number, number]} */
export function colormap(t) {
  const x = Math.min(1, Math.max(0, t)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const f = x - i;
  const a = STOPS[i];
  const b = STOPS[i + 1];
  return /** @type {[number, number, number]} */ ([0, 1, 2].map((k) => Math.round(a[k] + (b[k] - a[k]) * f)));
}

/** @param {Float32Array | Float64Array} values @returns {[number, number]} finite min and max */
export function finiteRange(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (Number.isFinite(v)) {
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  if (lo === Infinity) return [0, 1];
  if (lo === hi) return [lo - 0.5, hi + 0.5];
  return [lo, hi];
}

/**
 * RGBA pixels of the matrix; NaN cells are transparent so the background shows "unknown".
 * @param {Float32Array | Float64Array} values @param {number} rows @param {number} cols
 */
export function toPixels(values, rows, cols) {
  const [lo, hi] = finiteRange(values);
  const pixels = new Uint8ClampedArray(rows * cols * 4);
  for (let i = 0; i < rows * cols; i += 1) {
    const v = values[i];
    if (!Number.isFinite(v)) continue;
    const [r, g, b] = colormap((v - lo) / (hi - lo));
    pixels.set([r, g, b, 255], i * 4);
  }
  return { pixels, lo, hi };
}

export class Heatmap {
  /** @param {HTMLElement} parent */
  constructor(parent) {
    this.root = document.createElement("div");
    this.root.className = "nbm-heatmap";
    this.canvas = document.createElement("canvas");
    this.canvas.className = "nbm-heatmap-canvas";
    // Row labels beside the canvas while they are legible; beyond that the tooltip names rows.
    this.labels = document.createElement("div");
    this.labels.className = "nbm-heatmap-labels";
    const body = document.createElement("div");
    body.className = "nbm-heatmap-body";
    body.append(this.labels, this.canvas);
    this.legend = document.createElement("div");
    this.legend.className = "nbm-heatmap-legend";
    this.root.append(body, this.legend);
    parent.append(this.root);
    /** @type {HeatmapData} */
    this.data = { values: new Float32Array(0), rows: 0, cols: 0, names: [], steps: new Float64Array(0) };
    this.onMove = (/** @type {MouseEvent} */ event) => this.hover(event);
    this.canvas.addEventListener("mousemove", this.onMove);
  }

  /**
   * @param {HeatmapData} data
   */
  draw(data) {
    this.data = data;
    const { values, rows, cols } = data;
    const rowPx = Math.max(3, Math.min(16, Math.floor(320 / Math.max(rows, 1))));
    this.canvas.width = Math.max(cols, 1);
    this.canvas.height = Math.max(rows, 1);
    this.canvas.style.height = `${rows * rowPx}px`;
    const { pixels, lo, hi } = toPixels(values, rows, cols);
    const steps = data.steps;
    const span =
      steps.length > 1 && isNum(steps[0]) ? `, steps ${Math.round(steps[0])}\u2013${Math.round(steps[steps.length - 1])}` : "";
    const label = data.label ?? "log10 grad norm";
    this.legend.textContent =
      rows && cols ? `${label}: ${fmtNumber(lo, 3)} (dark) \u2026 ${fmtNumber(hi, 3)} (bright)${span}` : "";
    const labelled = rows > 0 && rowPx >= 10;
    this.labels.hidden = !labelled;
    this.labels.replaceChildren(
      ...(labelled
        ? data.names.slice(0, rows).map((name) => {
            const label = document.createElement("div");
            label.className = "nbm-heatmap-label";
            label.style.height = `${rowPx}px`;
            // Line box taller than the glyphs, so descenders (underscores) are never clipped.
            label.style.lineHeight = `${rowPx}px`;
            label.style.fontSize = `${Math.min(11, rowPx - 2)}px`;
            label.textContent = middleEllipsis(name);
            label.title = name;
            return label;
          })
        : []),
    );
    if (rows === 0 || cols === 0) return;
    // jsdom and some headless setups have no 2D context; the legend and table still work.
    const ctx = this.canvas.getContext("2d");
    if (!ctx) return;
    ctx.putImageData(new ImageData(pixels, cols, rows), 0, 0);
  }

  /** @param {MouseEvent} event */
  hover(event) {
    const { rows, cols, names, steps, values } = this.data;
    const rect = this.canvas.getBoundingClientRect();
    if (!rows || !cols || rect.width <= 0 || rect.height <= 0) return;
    const c = Math.min(cols - 1, Math.floor(((event.clientX - rect.left) / rect.width) * cols));
    const r = Math.min(rows - 1, Math.floor(((event.clientY - rect.top) / rect.height) * rows));
    if (c < 0 || r < 0) return;
    const v = values[r * cols + c];
    const step = steps[c];
    const shown = this.data.label ? `${this.data.label} ${fmtNumber(v, 3)}` : `grad norm 1e${fmtNumber(v, 3)}`;
    this.canvas.title = `${names[r] ?? r} @ step ${isNum(step) ? Math.round(step) : "?"}: ${
      Number.isFinite(v) ? shown : "unknown"
    }`;
  }

  destroy() {
    this.canvas.removeEventListener("mousemove", this.onMove);
    this.root.remove();
  }
}
