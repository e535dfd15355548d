// A grid of time-series charts fed a curves panel's state ({series: {key: {x, y}}, notes}): the
// part the training and system panels share. A chart shows once one of its series has points.

import { decode } from "../codec.js";
import { TimeSeriesChart } from "../charts/timeseries.js";

/** @param {Record<string, any>} state @returns {Record<string, {x: ArrayLike<number>, y: ArrayLike<number>}>} */
export function curvesOf(state) {
  /** @type {Record<string, {x: ArrayLike<number>, y: ArrayLike<number>}>} */
  const out = {};
  for (const [key, value] of Object.entries(state?.series ?? {})) {
    const x = decode(value?.x);
    const y = decode(value?.y);
    const n = Math.min(x.length, y.length);
    out[key] = { x: x.subarray(0, n), y: y.subarray(0, n) };
  }
  return out;
}

export class ChartGrid {
  /** @param {HTMLElement} el @param {string} sync */
  constructor(el, sync) {
    this.grid = document.createElement("div");
    this.grid.className = "nbm-grid";
    el.append(this.grid);
    this.sync = sync;
    /** @type {Map<string, TimeSeriesChart>} */
    this.charts = new Map();
  }

  /** @param {import("../charts/timeseries.js").ChartSpec} spec */
  ensure(spec) {
    let chart = this.charts.get(spec.id);
    if (!chart) {
      chart = new TimeSeriesChart(this.grid, { ...spec, sync: this.sync });
      chart.root.hidden = true;
      this.charts.set(spec.id, chart);
    }
    return chart;
  }

  /** @param {Record<string, {x: ArrayLike<number>, y: ArrayLike<number>}>} curves @returns {number} charts shown */
  update(curves) {
    let shown = 0;
    for (const chart of this.charts.values()) if (chart.update(curves)) shown += 1;
    return shown;
  }

  destroy() {
    for (const chart of this.charts.values()) chart.destroy();
    this.grid.remove();
  }
}
