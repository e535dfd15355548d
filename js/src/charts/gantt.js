// A gantt of the last steps' phases and spans on a canvas: one row per track, a bar per span
// from its start to its end (ms since the first bar), its name inside where it fits, a few
// SI ticks along the time axis, and a hover read-out (name, step, start, duration).

import { siSeconds } from "../format.js";
import { themeOf } from "./theme.js";

const ROW = 18;
const LEFT = 90;
const AXIS = 18;

/**
 * @typedef {[string, string, number, number | null, number | null]} Bar track, name, step, start s, duration s
 */

/** A few round ticks across [0, span]. @param {number} span @param {number} [count] */
export function niceTicks(span, count = 5) {
  if (!(span > 0)) return [0];
  const raw = span / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => span / s <= count) ?? 10 * mag;
  const ticks = [];
  for (let t = 0; t <= span + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
  return ticks;
}

/** Bars laid out: tracks in order of appearance, times from the first start. @param {Bar[]} bars */
export function layout(bars) {
  const ok = bars.filter((b) => Number.isFinite(b[3]) && Number.isFinite(b[4]));
  const tracks = [...new Set(ok.map((b) => b[0]))];
  const t0 = ok.length ? Math.min(...ok.map((b) => /** @type {number} */ (b[3]))) : 0;
  const t1 = ok.length ? Math.max(...ok.map((b) => /** @type {number} */ (b[3]) + /** @type {number} */ (b[4]))) : 0;
  return {
    tracks,
    t0,
    span: t1 - t0,
    bars: ok.map((b) => ({
      track: b[0],
      name: b[1],
      step: b[2],
      row: tracks.indexOf(b[0]),
      start: /** @type {number} */ (b[3]) - t0,
      duration: /** @type {number} */ (b[4]),
    })),
  };
}

export class Gantt {
  /** @param {HTMLElement} parent @param {(name: string) => string} color */
  constructor(parent, color) {
    this.color = color;
    this.root = document.createElement("div");
    this.root.className = "nbm-chart nbm-gantt";
    this.root.dataset.chart = "gantt";
    const head = document.createElement("div");
    head.className = "nbm-chart-head";
    const title = document.createElement("span");
    title.className = "nbm-chart-title";
    title.textContent = "Last steps: phases and spans";
    head.append(title);
    this.canvas = document.createElement("canvas");
    this.canvas.className = "nbm-gantt-canvas";
    this.root.append(head, this.canvas);
    parent.append(this.root);
    this.laid = layout([]);
    this.onMove = (/** @type {MouseEvent} */ e) => this.hover(e);
    this.canvas.addEventListener("mousemove", this.onMove);
    this.observer = typeof ResizeObserver === "function" ? new ResizeObserver(() => this.draw()) : null;
    this.observer?.observe(this.root);
  }

  /** @param {Bar[]} bars */
  update(bars) {
    this.laid = layout(bars ?? []);
    this.root.hidden = this.laid.bars.length === 0;
    if (!this.root.hidden) this.draw();
    return !this.root.hidden;
  }

  draw() {
    const { tracks, span, bars } = this.laid;
    const width = Math.max(240, Math.floor(this.root.clientWidth || 360));
    const height = Math.max(1, tracks.length) * ROW + AXIS + 4;
    const ratio = typeof devicePixelRatio === "number" ? devicePixelRatio : 1;
    this.canvas.width = width * ratio;
    this.canvas.height = height * ratio;
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${height}px`;
    const ctx = this.canvas.getContext("2d");
    if (!ctx) return;
    const theme = themeOf(this.root);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = theme.font;
    ctx.textBaseline = "middle";
    const plotW = width - LEFT - 8;
    const scale = span > 0 ? plotW / span : 0;
    tracks.forEach((t, i) => {
      ctx.fillStyle = theme.muted;
      ctx.fillText(t.length > 14 ? `${t.slice(0, 13)}\u2026` : t, 4, i * ROW + ROW / 2);
    });
    for (const b of bars) {
      const x = LEFT + b.start * scale;
      const w = Math.max(1, b.duration * scale);
      ctx.fillStyle = this.color(b.name);
      ctx.fillRect(x, b.row * ROW + 3, w, ROW - 6);
      if (w > ctx.measureText(b.name).width + 6) {
        ctx.fillStyle = "#fff";
        ctx.fillText(b.name, x + 3, b.row * ROW + ROW / 2);
      }
    }
    const y = tracks.length * ROW + 2;
    ctx.strokeStyle = theme.grid;
    ctx.beginPath();
    ctx.moveTo(LEFT, y);
    ctx.lineTo(LEFT + plotW, y);
    ctx.stroke();
    ctx.fillStyle = theme.muted;
    ctx.textBaseline = "top";
    for (const t of niceTicks(span)) {
      const x = LEFT + t * scale;
      ctx.fillText(siSeconds(t), Math.min(x, width - 40), y + 3);
    }
  }

  /** @param {MouseEvent} event */
  hover(event) {
    const { span, bars } = this.laid;
    const rect = this.canvas.getBoundingClientRect();
    const plotW = rect.width - LEFT - 8;
    const t = ((event.clientX - rect.left - LEFT) / Math.max(plotW, 1)) * span;
    const row = Math.floor((event.clientY - rect.top) / ROW);
    const hit = bars.find((b) => b.row === row && t >= b.start && t <= b.start + b.duration);
    this.canvas.title = hit
      ? `${hit.name} (${hit.track}) step ${hit.step}: ${siSeconds(hit.duration)} at +${siSeconds(hit.start)}`
      : "";
  }

  destroy() {
    this.observer?.disconnect();
    this.canvas.removeEventListener("mousemove", this.onMove);
    this.root.remove();
  }
}
