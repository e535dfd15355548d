import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { align } from "../../src/charts/align.js";
import { TimeSeriesChart, logTicks, yRange } from "../../src/charts/timeseries.js";

let el;
beforeEach(() => {
  el = document.createElement("div");
  document.body.append(el);
});
afterEach(() => el.remove());

const f32 = (a) => Float32Array.from(a);

describe("align", () => {
  it("keeps shared x as is and maps NaN to gaps", () => {
    const [x, a, b] = align([
      { x: f32([1, 2, 3]), y: f32([5, Number.NaN, 7]) },
      { x: f32([1, 2, 3]), y: f32([1, 1, 1]) },
    ]);
    expect(x).toEqual([1, 2, 3]);
    expect(a).toEqual([5, null, 7]);
    expect(b).toEqual([1, 1, 1]);
  });

  it("merges different x on their union with gaps, in order", () => {
    const [x, a, b] = align([
      { x: f32([1, 3, 5]), y: f32([10, 30, 50]) },
      { x: f32([2, 3, 6]), y: f32([2, 3, 6]) },
    ]);
    expect(x).toEqual([1, 2, 3, 5, 6]);
    expect(a).toEqual([10, null, 30, 50, null]);
    expect(b).toEqual([null, 2, 3, null, 6]);
  });

  it("drops values a log axis cannot show", () => {
    const [, a] = align([{ x: f32([1, 2, 3]), y: f32([0, -1, 2]) }], { log: true });
    expect(a).toEqual([null, null, 2]);
  });
});

describe("axes", () => {
  it("gives a constant series a readable range and pads others", () => {
    const [a, b] = yRange(0.01, 0.01, false);
    expect(a).toBeCloseTo(0.009, 12);
    expect(b).toBeCloseTo(0.011, 12);
    expect(yRange(0, 0, false)).toEqual([-1, 1]);
    const [lo, hi] = yRange(2, 4, false);
    expect(lo).toBeLessThan(2);
    expect(hi).toBeGreaterThan(4);
    expect(yRange(0.1, 3, false)[0]).toBe(0); // a positive series near 0 starts at 0
    expect(yRange(0.03, 400, true)).toEqual([0.01, 1000]);
  });

  it("labels a log axis with powers of ten only, a handful at most", () => {
    expect(logTicks(0.01, 1000)).toEqual([0.01, 0.1, 1, 10, 100, 1000]);
    expect(logTicks(1e-8, 1e4).length).toBeLessThanOrEqual(7);
  });
});

describe("TimeSeriesChart (curves)", () => {
  const spec = {
    id: "loss",
    title: "Loss",
    toggleLog: true,
    lines: [
      { key: "loss", label: "loss", color: "#aaa" },
      { key: "loss_smooth", label: "smoothed", color: "#00f" },
    ],
  };

  it("stays hidden without data, then draws its series in a canvas with the legend outside", () => {
    const chart = new TimeSeriesChart(el, spec);
    expect(chart.update({})).toBe(false);
    expect(chart.root.hidden).toBe(true);
    expect(chart.update({ loss: { x: f32([1, 2, 3]), y: f32([3, 2, 1]) } })).toBe(true);
    expect(chart.root.hidden).toBe(false);
    expect(chart.plot.data[0]).toEqual([1, 2, 3]);
    expect(chart.plot.data[1]).toEqual([3, 2, 1]);
    expect(chart.plot.data[2]).toEqual([null, null, null]); // no smoothed curve yet
    expect(el.querySelector("canvas")).not.toBeNull();
    // The legend (the hover read-out) is below the plotting area, not over the data.
    const wrap = el.querySelector(".u-wrap");
    const legend = el.querySelector(".u-legend");
    expect(wrap.compareDocumentPosition(legend) & Node.DOCUMENT_POSITION_FOLLOWING).toBeTruthy();
    expect(legend.textContent).toContain("smoothed");
    chart.destroy();
  });

  it("reads out the newest values while no step is hovered, and the hovered step's otherwise", () => {
    const chart = new TimeSeriesChart(el, spec);
    chart.update({ loss: { x: f32([1, 2, 3]), y: f32([3, 2, Number.NaN]) } });
    const loss = chart.plot.series[1];
    expect(loss.value(chart.plot, null, 1, null)).toBe("2"); // the newest finite value
    expect(loss.value(chart.plot, 3, 1, 0)).toBe("3");
    expect(chart.plot.series[0].value(chart.plot, null, 0, null)).toBe("3"); // the newest step
    chart.destroy();
  });

  it("updates in place: the same uPlot instance takes the new data", () => {
    const chart = new TimeSeriesChart(el, spec);
    chart.update({ loss: { x: f32([1, 2]), y: f32([3, 2]) } });
    const plot = chart.plot;
    chart.update({ loss: { x: f32([1, 2, 3]), y: f32([3, 2, 1.5]) } });
    expect(chart.plot).toBe(plot);
    expect(chart.plot.data[1]).toEqual([3, 2, 1.5]);
    chart.destroy();
  });

  it("switches between linear and log on its toggle", () => {
    const chart = new TimeSeriesChart(el, spec);
    chart.update({ loss: { x: f32([1, 2, 3]), y: f32([100, 10, 1]) } });
    const toggle = el.querySelector(".nbm-toggle");
    expect(toggle.textContent).toBe("linear");
    expect(chart.plot.scales.y.distr).toBe(1);
    toggle.click();
    expect(toggle.textContent).toBe("log");
    expect(chart.plot.scales.y.distr).toBe(3);
    chart.destroy();
  });

  it("formats y ticks with the chart's unit: SI, bytes, seconds", () => {
    const chart = new TimeSeriesChart(el, { id: "ram", title: "RAM", unit: "bytes", lines: [{ key: "r", label: "r", color: "#000" }] });
    chart.update({ r: { x: f32([1, 2]), y: f32([2 ** 30, 2 ** 31]) } });
    const values = chart.plot.axes[1].values(chart.plot, [1.25 * 2 ** 30, 1.5 * 2 ** 30]);
    expect(values).toEqual(["1.25 GiB", "1.5 GiB"]);
    // Round binary ticks, not 0.931 GiB.
    const ticks = chart.plot.axes[1].splits(chart.plot, 1, 2 ** 30, 2 ** 31);
    expect(chart.plot.axes[1].values(chart.plot, ticks)).toEqual(["1 GiB", "1.25 GiB", "1.5 GiB", "1.75 GiB", "2 GiB"]);
    const xs = chart.plot.axes[0].values(chart.plot, [0, 18000, 1e6]);
    expect(xs).toEqual(["0", "18k", "1M"]);
    chart.destroy();
  });
});

describe("TimeSeriesChart (min-max band)", () => {
  it("fills between max and min under the median", () => {
    const chart = new TimeSeriesChart(el, {
      id: "step_time",
      title: "Step time",
      unit: "s",
      band: { lo: "lo", hi: "hi", label: "", color: "rgba(0,0,255,0.3)" },
      lines: [{ key: "mid", label: "median", color: "#00f" }],
    });
    const x = f32([1, 2, 3]);
    chart.update({ lo: { x, y: f32([0.01, 0.01, 0.01]) }, hi: { x, y: f32([0.05, 0.2, 0.05]) }, mid: { x, y: f32([0.02, 0.03, 0.02]) } });
    expect(chart.plot.bands).toHaveLength(1);
    expect(chart.plot.bands[0].series).toEqual([1, 2]); // hi, lo
    expect(chart.plot.data[1][1]).toBeCloseTo(0.2);
    expect(chart.plot.data[2][1]).toBeCloseTo(0.01);
    expect(chart.plot.data[3][1]).toBeCloseTo(0.03);
    expect(chart.plot.axes[1].values(chart.plot, [0.01, 0.045])).toEqual(["10 ms", "45 ms"]);
    chart.destroy();
  });
});
