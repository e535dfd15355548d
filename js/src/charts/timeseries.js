// Curves against the step, drawn by uPlot in a canvas: lines, an optional min-max band, a
// linear or log y axis. A handful of ticks with short SI labels, the legend below the plot
// (outside the data) doubling as the hover read-out of exact values, drag to zoom and
// double-click to reset, and a cursor shared by the charts of one dashboard.

import uPlot from "uplot";
import { byteTicks, formatter, si, tickLabels } from "../format.js";
import { align } from "./align.js";
import { themeOf } from "./theme.js";

export const HEIGHT = 140;

/**
 * @typedef {{key: string, label: string, color: string, width?: number, dash?: number[]}} LineSpec
 * @typedef {{lo: string, hi: string, label: string, color: string}} BandSpec
 * @typedef {{id: string, title: string, unit?: string, log?: boolean, toggleLog?: boolean,
 *            lines: LineSpec[], band?: BandSpec, sync?: string, markColor?: string}} ChartSpec
 * @typedef {{x: ArrayLike<number>, y: ArrayLike<number>}} Curve
 */

/**
 * y range: padded, never empty (a constant learning rate gets a readable axis).
 * @param {number | null} min @param {number | null} max @param {boolean} log
 * @returns {[number, number]}
 */
export function yRange(min, max, log) {
  if (min == null || max == null || !Number.isFinite(min) || !Number.isFinite(max)) return log ? [0.1, 10] : [0, 1];
  if (log) {
    const lo = 10 ** Math.floor(Math.log10(min));
    const hi = 10 ** Math.ceil(Math.log10(max));
    return lo === hi ? [lo / 10, hi * 10] : [lo, hi];
  }
  if (min === max) {
    const pad = min === 0 ? 1 : Math.abs(min) * 0.1;
    return [min - pad, max + pad];
  }
  const pad = (max - min) * 0.06;
  return [min >= 0 && min - pad < 0 ? 0 : min - pad, max + pad];
}

/** Log-axis ticks: the powers of ten only (1..9 x 10^n crowd the axis). */
export function logTicks(min, max) {
  const ticks = [];
  for (let e = Math.floor(Math.log10(min)); e <= Math.ceil(Math.log10(max)); e += 1) {
    const v = 10 ** e;
    if (v >= min * 0.999 && v <= max * 1.001) ticks.push(v);
  }
  // Many decades: every other one.
  return ticks.length > 6 ? ticks.filter((_, i) => i % 2 === 0) : ticks;
}

/** The y axis's width: its longest label, so "1.25 GiB" is never cut. */
export function axisSize(_u, values) {
  const longest = Math.max(3, ...(values ?? []).map((v) => String(v ?? "").length));
  return Math.ceil(longest * 6.4 + 12);
}

/** The newest finite value of series `sidx`: what the legend shows while no step is hovered. */
export function newest(u, sidx) {
  const data = u.data?.[sidx] ?? [];
  for (let i = data.length - 1; i >= 0; i -= 1) if (data[i] != null && Number.isFinite(data[i])) return data[i];
  return null;
}

export class TimeSeriesChart {
  /** @param {HTMLElement} parent @param {ChartSpec} spec */
  constructor(parent, spec) {
    this.spec = spec;
    this.log = Boolean(spec.log);
    this.root = document.createElement("div");
    this.root.className = "nbm-chart";
    this.root.dataset.chart = spec.id;
    const head = document.createElement("div");
    head.className = "nbm-chart-head";
    this.title = document.createElement("span");
    this.title.className = "nbm-chart-title";
    this.title.textContent = spec.title;
    this.title.title = "drag to zoom, double-click to reset";
    head.append(this.title);
    if (spec.toggleLog) {
      this.toggle = document.createElement("button");
      this.toggle.className = "nbm-toggle";
      this.toggle.type = "button";
      this.toggle.addEventListener("click", () => this.setLog(!this.log));
      head.append(this.toggle);
    }
    this.plotEl = document.createElement("div");
    this.plotEl.className = "nbm-plot";
    this.root.append(head, this.plotEl);
    parent.append(this.root);
    /** @type {Record<string, Curve>} */
    this.curves = {};
    /** @type {[number, number][]} marks: [step, value] (a learning rate asked at that step) */
    this.marks = [];
    this.plot = null;
    this.fmt = formatter(spec.unit ?? "");
    this.observer =
      typeof ResizeObserver === "function" ? new ResizeObserver(() => this.resize()) : null;
    this.observer?.observe(this.plotEl);
    this.updateToggle();
  }

  /** @param {string} text */
  setTitle(text) {
    if (this.title.textContent !== text) this.title.textContent = text;
  }

  setLog(on) {
    this.log = on;
    this.updateToggle();
    this.plot?.destroy();
    this.plot = null;
    this.draw();
  }

  updateToggle() {
    if (!this.toggle) return;
    this.toggle.textContent = this.log ? "log" : "linear";
    this.toggle.title = `y axis: ${this.log ? "log" : "linear"} (click to switch)`;
  }

  /** The series this chart draws, in uPlot order: band hi and lo first, then the lines. */
  keys() {
    const band = this.spec.band ? [this.spec.band.hi, this.spec.band.lo] : [];
    return [...band, ...this.spec.lines.map((l) => l.key)];
  }

  /**
   * Vertical marks at steps where something was changed (the lr asked from the dashboard):
   * drawn over the plot, listed in the title's tooltip and counted in `data-marks`.
   * @param {[number, number][]} marks
   */
  setMarks(marks) {
    const next = Array.isArray(marks) ? marks.filter((m) => Array.isArray(m) && isFinite(m[0])) : [];
    const same = next.length === this.marks.length && next.every((m, i) => m[0] === this.marks[i][0] && m[1] === this.marks[i][1]);
    if (same) return;
    this.marks = next;
    this.root.dataset.marks = String(next.length);
    const said = next.map((m) => `set to ${this.fmt(m[1])} at step ${si(m[0], 6)}`);
    this.title.title = ["drag to zoom, double-click to reset", ...said].join("\n");
    this.plot?.redraw(false, false);
  }

  /** @param {any} u */
  drawMarks(u) {
    if (!this.marks.length) return;
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    const color = this.spec.markColor ?? "#888";
    ctx.save();
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = Math.max(1, devicePixelRatio || 1);
    ctx.setLineDash([4, 3]);
    for (const [step, value] of this.marks) {
      const x = u.valToPos(step, "x", true);
      if (!(x >= left && x <= left + width)) continue;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      const y = u.valToPos(value, "y", true);
      if (y >= top && y <= top + height) {
        ctx.beginPath();
        ctx.arc(x, y, 3 * (devicePixelRatio || 1), 0, 2 * Math.PI);
        ctx.fill();
      }
    }
    ctx.restore();
  }

  /** @param {Record<string, Curve>} curves @returns {boolean} whether there is anything to draw */
  update(curves) {
    this.curves = curves;
    const any = this.keys().some((k) => curves[k] && curves[k].x.length > 0);
    this.root.hidden = !any;
    if (any) this.draw();
    return any;
  }

  data() {
    const empty = { x: [], y: [] };
    return align(
      this.keys().map((k) => this.curves[k] ?? empty),
      { log: this.log },
    );
  }

  width() {
    return Math.max(200, Math.floor(this.plotEl.clientWidth || this.root.clientWidth || 320));
  }

  resize() {
    if (this.plot && this.plotEl.clientWidth > 0) this.plot.setSize({ width: this.width(), height: HEIGHT });
  }

  draw() {
    const data = this.data();
    if (this.plot) {
      this.plot.setData(/** @type {any} */ (data));
      return;
    }
    this.plot = new uPlot(this.options(), /** @type {any} */ (data), this.plotEl);
  }

  options() {
    const theme = themeOf(this.root);
    const spec = this.spec;
    const unit = spec.unit ?? "";
    const log = this.log;
    // Hovered: the values at that step; otherwise the newest ones.
    const value = (/** @type {any} */ u, /** @type {number | null} */ v, /** @type {number} */ sidx, /** @type {number | null} */ idx) => {
      const shown = idx == null ? newest(u, sidx) : v;
      return shown == null ? "\u2013" : this.fmt(shown);
    };
    /** @type {any[]} */
    const series = [
      { label: "step", value: (u, v, _s, idx) => ((idx == null ? newest(u, 0) : v) == null ? "\u2013" : si(idx == null ? newest(u, 0) : v, 6)) },
    ];
    /** @type {any[]} */
    const bands = [];
    if (spec.band) {
      const b = spec.band;
      series.push({ label: `${b.label} max`.trim(), stroke: b.color, width: 0.5, value });
      series.push({ label: `${b.label} min`.trim(), stroke: b.color, width: 0.5, value });
      bands.push({ series: [1, 2], fill: b.color });
    }
    for (const line of spec.lines) {
      series.push({
        label: line.label,
        stroke: line.color,
        width: line.width ?? 1.5,
        dash: line.dash,
        value,
        spanGaps: true,
      });
    }
    for (const s of series.slice(1)) s.spanGaps = true;
    const axis = {
      stroke: theme.muted,
      font: theme.font,
      grid: { stroke: theme.grid, width: 1 },
      ticks: { stroke: theme.grid, width: 1, size: 4 },
    };
    return {
      width: this.width(),
      height: HEIGHT,
      series,
      bands,
      legend: { show: true, live: true },
      hooks: { draw: [(/** @type {any} */ u) => this.drawMarks(u)] },
      cursor: { sync: spec.sync ? { key: spec.sync } : undefined, drag: { x: true, y: false } },
      scales: {
        x: { time: false },
        y: /** @type {uPlot.Scale} */ (
          log
            ? { distr: 3, log: 10, range: (_u, min, max) => yRange(min, max, true) }
            : { range: (_u, min, max) => yRange(min, max, false) }
        ),
      },
      axes: [
        {
          ...axis,
          space: 70,
          size: 30,
          values: (_u, ticks) => ticks.map((t) => (t == null ? "" : si(t))),
        },
        {
          ...axis,
          space: 28,
          size: axisSize,
          // Our log ticks are already few: uPlot's own log filter would blank every other one.
          filter: log ? (_u, splits) => splits : undefined,
          splits: log
            ? (_u, _i, min, max) => logTicks(min, max)
            : unit === "bytes"
              ? (_u, _i, min, max) => byteTicks(min, max)
              : undefined,
          values: (_u, ticks) => tickLabels(ticks, unit),
        },
      ],
    };
  }

  destroy() {
    this.observer?.disconnect();
    this.plot?.destroy();
    this.plot = null;
    this.root.remove();
  }
}
