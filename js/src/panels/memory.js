// The memory panel: the training device's memory step by step (CUDA: allocated, reserved, each
// interval's peak, fragmentation; CPU: the process's resident size; MPS: the driver's
// allocation), and a line with the headroom and the largest batch estimated to fit.

import { COLORS } from "../charts/theme.js";
import { ChartGrid, curvesOf } from "./curves.js";

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
      { key: "mps_driver_allocated_bytes", label: "MPS driver", color: COLORS.green },
    ],
  },
];

/** @param {number} n */
function gib(n) {
  return `${(n / 2 ** 30).toPrecision(3)} GiB`;
}

/** @param {Record<string, number>} notes */
export function headroomText(notes) {
  const peak = notes?.memory_peak_bytes;
  const limit = notes?.memory_limit_bytes;
  if (!Number.isFinite(peak) || !Number.isFinite(limit)) return "";
  let text = `peak ${gib(peak)} of ${gib(limit)} (${gib(limit - peak)} free)`;
  if (Number.isFinite(notes.batch_fits) && Number.isFinite(notes.batch_size)) {
    text += `; batch ${Math.round(notes.batch_size)}, up to ~${Math.round(notes.batch_fits)} estimated to fit`;
  }
  return text;
}

export default {
  name: "memory",
  title: "Memory",
  /** @param {HTMLElement} el @param {{sync: string}} ctx */
  create(el, ctx) {
    const line = document.createElement("div");
    line.className = "nbm-memory-headroom";
    el.appendChild(line);
    const grid = new ChartGrid(el, ctx.sync);
    return {
      /** @param {Record<string, any>} state */
      update(state) {
        const curves = curvesOf(state);
        for (const spec of CHARTS) {
          if (spec.lines.some((l) => curves[l.key])) grid.ensure(spec);
        }
        line.textContent = headroomText(state?.notes ?? {});
        return grid.update(curves) > 0 || line.textContent !== "";
      },
      destroy: () => {
        grid.destroy();
        line.remove();
      },
    };
  },
};
