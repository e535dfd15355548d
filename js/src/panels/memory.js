// The memory panel: the training device's memory step by step (CUDA: allocated, reserved, each
// interval's peak, fragmentation; CPU: the process's resident size; MPS: the driver's
// allocation), a line with the headroom and the largest batch estimated to fit, and the table
// of what holds memory on each device (the newest breakdown against what was measured).

import { COLORS } from "../charts/theme.js";
import { ChartGrid, curvesOf } from "./curves.js";
import { LayerTable } from "./table.js";

export const TABLE_COLUMNS = [
  { key: "device", label: "device", kind: "text" },
  { key: "parameters", label: "parameters", kind: "bytes" },
  { key: "buffers", label: "buffers", kind: "bytes" },
  { key: "gradients", label: "gradients", kind: "bytes" },
  { key: "optimizer_state", label: "optimizer state", kind: "bytes" },
  { key: "activations", label: "activations", kind: "bytes" },
  { key: "other", label: "other", kind: "bytes" },
  { key: "measured", label: "measured", kind: "bytes" },
  { key: "measured_what", label: "measured as", kind: "text" },
];

export const CHARTS = [
  {
    id: "cuda",
    title: "CUDA memory",
    unit: "bytes",
    lines: [
      { key: "cuda_allocated_bytes", label: "allocated", color: COLORS.blue },
      { key: "cuda_reserved_bytes", label: "reserved", color: COLORS.orange },
      { key: "cuda_interval_peak_bytes", label: "peak", color: COLORS.red },
    ],
  },
  {
    id: "fragmentation",
    title: "Fragmentation (inactive split blocks)",
    unit: "bytes",
    lines: [{ key: "cuda_inactive_split_bytes", label: "inactive split", color: COLORS.purple }],
  },
  {
    id: "host",
    title: "Memory",
    unit: "bytes",
    lines: [
      { key: "process_rss_bytes", label: "this process (RSS)", color: COLORS.orange },
      // Only on Apple's GPU: a CPU run's chart has no legend entry for it.
      { key: "mps_driver_allocated_bytes", label: "MPS driver", color: COLORS.green, optional: true },
    ],
  },
];

/** @param {number} n */
function gib(n) {
  return `${(n / 2 ** 30).toPrecision(3)} GiB`;
}

/** @param {Record<string, any>} notes */
export function headroomText(notes) {
  const peak = notes?.memory_peak_bytes;
  const limit = notes?.memory_limit_bytes;
  const allocator = typeof notes?.allocator === "string" && notes.allocator ? `CUDA allocator: ${notes.allocator}` : "";
  if (!Number.isFinite(peak) || !Number.isFinite(limit)) return allocator;
  let text = `peak ${gib(peak)} of ${gib(limit)} (${gib(limit - peak)} free)`;
  if (Number.isFinite(notes.batch_fits) && Number.isFinite(notes.batch_size)) {
    const fits = Math.round(notes.batch_fits);
    const up = notes.batch_fits_more === 1 ? `over ${fits}` : `up to ~${fits}`;
    text += `; batch ${Math.round(notes.batch_size)}, ${up} estimated to fit`;
  }
  return allocator ? `${text}; ${allocator}` : text;
}

/** @param {Record<string, any>} state */
export function tableTitle(state) {
  if (!Number.isFinite(state?.table_step)) return "";
  const act = Number.isFinite(state.activations_step)
    ? `activations from step ${state.activations_step}`
    : "no activations sampled yet";
  return `What holds memory (step ${state.table_step}; ${act})`;
}

export default {
  name: "memory",
  title: "Memory",
  /** @param {HTMLElement} el @param {{sync: string}} ctx */
  create(el, ctx) {
    const line = document.createElement("div");
    line.className = "nbm-memory-headroom";
    el.appendChild(line);
    const title = document.createElement("div");
    title.className = "nbm-section-title nbm-memory-title";
    el.appendChild(title);
    const box = document.createElement("div");
    box.className = "nbm-memory-table";
    el.appendChild(box);
    const table = new LayerTable(box, TABLE_COLUMNS);
    const grid = new ChartGrid(el, ctx.sync);
    return {
      /** @param {Record<string, any>} state */
      update(state) {
        const curves = curvesOf(state);
        for (const spec of CHARTS) {
          // A line marked optional is drawn (and named in the legend) only where it has data.
          const lines = spec.lines.filter((l) => !l.optional || curves[l.key]);
          if (lines.some((l) => curves[l.key])) grid.ensure({ ...spec, lines });
        }
        line.textContent = headroomText(state?.notes ?? {});
        const rows = Array.isArray(state?.table) ? state.table : [];
        title.textContent = rows.length ? tableTitle(state) : "";
        title.hidden = box.hidden = rows.length === 0;
        table.update(rows);
        return grid.update(curves) > 0 || line.textContent !== "" || rows.length > 0;
      },
      destroy: () => {
        grid.destroy();
        table.destroy();
        line.remove();
        title.remove();
        box.remove();
      },
    };
  },
};
