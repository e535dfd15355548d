// The system panel: CPU (the machine's, and this process's as top shows it: 100% per busy core),
// RAM, and per accelerator its utilisation and memory share, and its power.

import { COLORS } from "../charts/theme.js";
import { ChartGrid, curvesOf } from "./curves.js";

export const HOST_CHARTS = [
  {
    id: "cpu",
    title: "CPU",
    unit: "%",
    lines: [
      { key: "cpu_percent", label: "machine", color: COLORS.blue },
      { key: "process_cpu_percent", label: "this process", color: COLORS.orange },
    ],
  },
  {
    id: "ram",
    title: "RAM",
    unit: "bytes",
    lines: [
      { key: "ram_used_bytes", label: "used", color: COLORS.blue },
      { key: "process_rss_bytes", label: "this process", color: COLORS.orange },
    ],
  },
];

/** @param {number} i */
export function deviceCharts(i) {
  const p = `gpu${i}_`;
  return [
    {
      id: `gpu${i}`,
      title: `GPU ${i}: utilisation and memory`,
      unit: "%",
      lines: [
        { key: `${p}util_percent`, label: "util", color: COLORS.green },
        { key: `${p}mem_used_bytes`, label: "memory", color: COLORS.purple },
      ],
    },
    { id: `gpu${i}_power`, title: `GPU ${i}: power`, unit: "W", lines: [{ key: `${p}power_w`, label: "power", color: COLORS.red }] },
  ];
}

export default {
  name: "system",
  title: "System",
  /** @param {HTMLElement} el @param {{sync: string}} ctx */
  create(el, ctx) {
    const grid = new ChartGrid(el, ctx.sync);
    for (const spec of HOST_CHARTS) grid.ensure(spec);
    return {
      /** @param {Record<string, any>} state */
      update(state) {
        const devices = Array.isArray(state?.notes?.devices) ? state.notes.devices : [];
        for (const i of devices.slice(0, 16)) for (const spec of deviceCharts(Number(i))) grid.ensure(spec);
        return grid.update(curvesOf(state)) > 0;
      },
      destroy: () => grid.destroy(),
    };
  },
};
