import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { StackedChart, stack } from "../../src/charts/stacked.js";

let el;
beforeEach(() => {
  el = document.createElement("div");
  document.body.append(el);
});
afterEach(() => el.remove());

describe("stacked phases", () => {
  const names = ["data", "forward", "backward"];
  const seconds = Float32Array.from([0.05, 0.05, 0.01, 0.02, 0.02, Number.NaN]); // 3 x 2

  it("stacks running totals, the top of the stack first", () => {
    const s = stack(names, [1, 2], seconds);
    expect(s.names).toEqual(["backward", "forward", "data"]);
    expect(s.tops[2].map((v) => Number(v.toFixed(4)))).toEqual([0.05, 0.05]);
    expect(s.tops[1].map((v) => Number(v.toFixed(4)))).toEqual([0.06, 0.07]);
    expect(s.tops[0].map((v) => Number(v.toFixed(4)))).toEqual([0.08, 0.07]); // NaN counts as 0
    expect(s.own[0].map((v) => Number(v.toFixed(4)))).toEqual([0.02, 0]);
  });

  it("draws filled areas and reads out each phase's own time", () => {
    const chart = new StackedChart(el, { id: "phases", title: "Step phases", colors: { data: "#f00" } });
    expect(chart.update([], [], new Float32Array(0))).toBe(false);
    expect(chart.root.hidden).toBe(true);
    expect(chart.update(names, [1, 2], seconds)).toBe(true);
    expect(chart.plot.series.slice(1).map((s) => s.label)).toEqual(["backward", "forward", "data"]);
    expect(chart.plot.series[3].fill).toBeTruthy();
    // The legend's value for "forward" at index 1 is its own 20 ms, not the running total.
    expect(chart.plot.series[2].value(chart.plot, 0.07, 2, 1)).toBe("20 ms");
    const plot = chart.plot;
    chart.update(names, [1, 2, 3], Float32Array.from([1, 1, 1, 1, 1, 1, 1, 1, 1]));
    expect(chart.plot).toBe(plot); // same phases: updated in place
    chart.destroy();
  });
});
