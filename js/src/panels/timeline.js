// The time panel: the step phases stacked against the step, a gantt of the last steps' phases
// and spans, and the telemetry summary (count, mean, median, std, min, max, total, % of run).

import { decode, shapeOf } from "../codec.js";
import { Gantt } from "../charts/gantt.js";
import { StackedChart } from "../charts/stacked.js";
import { COLORS } from "../charts/theme.js";
import { DASH, isNum, siSeconds } from "../format.js";

export const PHASE_COLORS = {
  data: COLORS.red,
  forward: COLORS.blue,
  backward: COLORS.orange,
  other: COLORS.grey,
  optimizer: COLORS.green,
};
const SPAN_COLORS = [COLORS.purple, COLORS.brown, COLORS.pink, COLORS.teal, "#bcbd22"];

/** @param {string} name */
export function spanColor(name) {
  if (name in PHASE_COLORS) return PHASE_COLORS[/** @type {keyof typeof PHASE_COLORS} */ (name)];
  let sum = 0;
  for (const c of new TextEncoder().encode(name)) sum += c;
  return SPAN_COLORS[sum % SPAN_COLORS.length];
}

const COLUMNS = [
  ["count", "count"],
  ["mean_s", "mean"],
  ["median_s", "median"],
  ["std_s", "std"],
  ["min_s", "min"],
  ["max_s", "max"],
  ["total_s", "total"],
  ["percent", "% of run"],
];

/** @param {Record<string, any>[]} rows */
export function summaryTable(rows) {
  const table = document.createElement("table");
  table.className = "nbm-table nbm-timeline-summary";
  const head = document.createElement("tr");
  for (const label of ["", ...COLUMNS.map((c) => c[1])]) {
    const th = document.createElement("th");
    th.textContent = label;
    head.append(th);
  }
  table.append(head);
  for (const row of rows) {
    const tr = document.createElement("tr");
    const name = document.createElement("th");
    name.textContent = `${row.name} (${row.kind})`;
    tr.append(name);
    for (const [key] of COLUMNS) {
      const td = document.createElement("td");
      const v = row[key];
      td.textContent =
        key === "count" ? String(v ?? DASH) : key === "percent" ? (isNum(v) ? `${v.toFixed(1)} %` : DASH) : siSeconds(v);
      tr.append(td);
    }
    table.append(tr);
  }
  return table;
}

export default {
  name: "timeline",
  title: "Time",
  /** @param {HTMLElement} el @param {{sync: string}} ctx */
  create(el, ctx) {
    const grid = document.createElement("div");
    grid.className = "nbm-grid";
    el.append(grid);
    const phases = new StackedChart(grid, { id: "phases", title: "Step phases (per step)", colors: PHASE_COLORS, sync: ctx.sync });
    const gantt = new Gantt(grid, spanColor);
    // Which steps' phases the device timed (CUDA events); the others' are the host clock's.
    const note = document.createElement("div");
    note.className = "nbm-note";
    note.hidden = true;
    const summary = document.createElement("div");
    el.append(note, summary);
    return {
      /** @param {Record<string, any>} state */
      update(state) {
        const names = Array.isArray(state?.phases) ? state.phases.map(String) : [];
        const steps = decode(state?.steps);
        const [rows, cols] = shapeOf(state?.seconds);
        const seconds = decode(state?.seconds);
        const ok = rows === names.length && cols === steps.length && seconds.length === rows * cols;
        const a = phases.update(ok ? names : [], steps, seconds);
        const b = gantt.update(Array.isArray(state?.gantt) ? state.gantt : []);
        const every = Number(state?.device_every) || 0;
        note.textContent = every > 0 && ok && steps.length
          ? `Phases timed on the device (CUDA events) on every ${every}th step (${every}, ${2 * every}, …); ` +
            "the other steps on the host clock: the time their work took to queue."
          : "";
        note.hidden = !note.textContent;  // no room taken on the host clock's runs
        const rowsOut = Array.isArray(state?.summary) ? state.summary : [];
        summary.replaceChildren(...(rowsOut.length ? [summaryTable(rowsOut)] : []));
        return a || b || rowsOut.length > 0;
      },
      destroy() {
        phases.destroy();
        gantt.destroy();
        grid.remove();
        note.remove();
        summary.remove();
      },
    };
  },
};
