// Stacked areas against the step (the step phases: data, forward, backward, optimizer, other),
// drawn by uPlot: each phase's running total is filled down to zero, the tallest first, so each
// area covers those above it except its own band. The legend lists the phases top-down with
// their own (not cumulative) seconds at the cursor.

import uPlot from "uplot";
import { si, siSeconds, tickLabels } from "../format.js";
import { HEIGHT, axisSize, newest, yRange } from "./timeseries.js";
import { themeOf } from "./theme.js";

/**
 * Running totals of the rows, top of the stack first.
 * @param {string[]} names @param {ArrayLike<number>} steps @param {Float32Array | Float64Array} seconds rows x steps
 * @returns {{names: string[], tops: number[][], own: number[][]}}
 */
export function stack(names, steps, seconds) {
  const n = steps.length;
  const tops = [];
  const own = [];
  const total = new Array(n).fill(0);
  names.forEach((_, r) => {
    const row = [];
    for (let c = 0; c < n; c += 1) {
      const v = seconds[r * n + c];
      row.push(Number.isFinite(v) ? v : 0);
      total[c] += row[c];
    }
    own.push(row);
    tops.push(total.slice());
  });
  return { names: names.slice().reverse(), tops: tops.reverse(), own: own.reverse() };
}

export class StackedChart {
  /** @param {HTMLElement} parent @param {{id: string, title: string, colors: Record<string, string>, sync?: string}} spec */
  constructor(parent, spec) {
    this.spec = spec;
    this.root = document.createElement("div");
    this.root.className = "nbm-chart";
    this.root.dataset.chart = spec.id;
    const head = document.createElement("div");
    head.className = "nbm-chart-head";
    const title = document.createElement("span");
    title.className = "nbm-chart-title";
    title.textContent = spec.title;
    head.append(title);
    this.plotEl = document.createElement("div");
    this.plotEl.className = "nbm-plot";
    this.root.append(head, this.plotEl);
    parent.append(this.root);
    this.plot = null;
    this.key = "";
    this.own = /** @type {number[][]} */ ([]);
    this.observer = typeof ResizeObserver === "function" ? new ResizeObserver(() => this.resize()) : null;
    this.observer?.observe(this.plotEl);
  }

  /** @param {string[]} names @param {ArrayLike<number>} steps @param {Float32Array | Float64Array} seconds */
  update(names, steps, seconds) {
    this.root.hidden = names.length === 0 || steps.length === 0;
    if (this.root.hidden) return false;
    const s = stack(names, steps, seconds);
    this.own = s.own;
    const data = [Array.from(steps), ...s.tops];
    const key = s.names.join(",");
    if (this.plot && key === this.key) {
      this.plot.setData(/** @type {any} */ (data));
      return true;
    }
    this.plot?.destroy();
    this.key = key;
    this.plot = new uPlot(this.options(s.names), /** @type {any} */ (data), this.plotEl);
    return true;
  }

  width() {
    return Math.max(200, Math.floor(this.plotEl.clientWidth || this.root.clientWidth || 320));
  }

  resize() {
    if (this.plot && this.plotEl.clientWidth > 0) this.plot.setSize({ width: this.width(), height: HEIGHT });
  }

  /** @param {string[]} names */
  options(names) {
    const theme = themeOf(this.root);
    const axis = {
      stroke: theme.muted,
      font: theme.font,
      grid: { stroke: theme.grid, width: 1 },
      ticks: { stroke: theme.grid, width: 1, size: 4 },
    };
    return {
      width: this.width(),
      height: HEIGHT,
      legend: { show: true, live: true },
      cursor: { sync: this.spec.sync ? { key: this.spec.sync } : undefined, drag: { x: true, y: false } },
      scales: { x: { time: false }, y: { range: (_u, _min, max) => yRange(0, max, false) } },
      series: [
        { label: "step", value: (u, v, _s, idx) => si(idx == null ? newest(u, 0) : v, 6) },
        ...names.map((name, i) => ({
          label: name,
          stroke: this.spec.colors[name] ?? "#8c8c8c",
          fill: this.spec.colors[name] ?? "#8c8c8c",
          width: 0.5,
          points: { show: false },
          value: (_u, _v, _si, idx) => {
            const row = this.own[i] ?? [];
            return siSeconds(idx == null ? row[row.length - 1] : row[idx]);
          },
        })),
      ],
      axes: [
        { ...axis, space: 70, size: 30, values: (_u, ticks) => ticks.map((t) => (t == null ? "" : si(t))) },
        { ...axis, space: 28, size: axisSize, values: (_u, ticks) => tickLabels(ticks, "s") },
      ],
    };
  }

  destroy() {
    this.observer?.disconnect();
    this.plot?.destroy();
    this.root.remove();
  }
}
