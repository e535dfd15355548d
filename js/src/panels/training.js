// The training panel: loss (raw and smoothed), learning rate, gradient norm (log axis, with the
// share of clipped steps in its title), step time (rolling median in its min-max band) and
// throughput (tokens/s where token ids were seen, else samples/s; raw and its rolling median).

import { COLORS } from "../charts/theme.js";
import { ChartGrid, curvesOf } from "./curves.js";

export const CHARTS = [
  {
    id: "loss",
    title: "Loss",
    toggleLog: true,
    lines: [
      { key: "loss", label: "loss", color: COLORS.lightBlue, width: 1 },
      { key: "loss_smooth", label: "smoothed", color: COLORS.blue, width: 2 },
    ],
  },
  // Marked: the learning rates asked while the run went (the steering bar, mon.set_lr, ctl).
  { id: "lr", title: "Learning rate", markColor: COLORS.orange, lines: [{ key: "lr", label: "lr", color: COLORS.green }] },
  {
    id: "grad_norm",
    title: "Gradient norm",
    log: true,
    toggleLog: true,
    lines: [{ key: "grad_norm", label: "grad norm", color: COLORS.purple }],
  },
  {
    id: "step_time",
    title: "Step time",
    unit: "s",
    band: { lo: "step_time_min", hi: "step_time_max", label: "", color: COLORS.lightBlue },
    lines: [{ key: "step_time_median", label: "median", color: COLORS.blue }],
  },
  {
    id: "tokens",
    title: "Tokens/s",
    lines: [
      { key: "tokens_per_s", label: "tokens/s", color: COLORS.lightOrange, width: 1 },
      { key: "tokens_per_s_smooth", label: "median", color: COLORS.orange, width: 2 },
    ],
  },
  {
    id: "throughput",
    title: "Samples/s",
    lines: [
      { key: "samples_per_s", label: "samples/s", color: COLORS.lightOrange, width: 1 },
      { key: "samples_per_s_smooth", label: "median", color: COLORS.orange, width: 2 },
    ],
  },
];

export default {
  name: "training",
  title: "Training",
  /** @param {HTMLElement} el @param {{sync: string}} ctx */
  create(el, ctx) {
    const grid = new ChartGrid(el, ctx.sync);
    for (const spec of CHARTS) grid.ensure(spec);
    return {
      /** @param {Record<string, any>} state */
      update(state) {
        const curves = curvesOf(state);
        // tokens/s replaces samples/s when both are known
        if (curves.tokens_per_s?.x.length) {
          delete curves.samples_per_s;
          delete curves.samples_per_s_smooth;
        }
        const clip = state?.notes?.grad_norm;
        grid.charts.get("grad_norm")?.setTitle(clip ? `Gradient norm: ${clip}` : "Gradient norm");
        grid.charts.get("lr")?.setMarks(state?.marks?.lr ?? []);
        return grid.update(curves) > 0;
      },
      destroy: () => grid.destroy(),
    };
  },
};
