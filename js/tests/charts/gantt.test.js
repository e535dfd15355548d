import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Gantt, layout, niceTicks } from "../../src/charts/gantt.js";

let el;
beforeEach(() => {
  el = document.createElement("div");
  document.body.append(el);
});
afterEach(() => el.remove());

const BARS = [
  ["phases", "data", 49, 10.0, 0.05],
  ["phases", "forward", 49, 10.05, 0.002],
  ["spans", "load", 49, 10.0, 0.049],
  ["spans depth 1", "decode", 49, 10.01, 0.02],
  ["spans", "bad", 49, null, 0.1],
];

describe("gantt", () => {
  it("lays bars out on tracks from the first start, dropping incomplete bars", () => {
    const l = layout(BARS);
    expect(l.tracks).toEqual(["phases", "spans", "spans depth 1"]);
    expect(l.bars.map((b) => b.row)).toEqual([0, 0, 1, 2]);
    expect(l.bars[1].start).toBeCloseTo(0.05);
    expect(l.span).toBeCloseTo(0.052);
  });

  it("puts a handful of round ticks on the time axis", () => {
    expect(niceTicks(0.052)).toEqual([0, 0.02, 0.04]);
    expect(niceTicks(0)).toEqual([0]);
  });

  it("draws one rectangle per bar on its canvas and reads a bar out on hover", () => {
    const gantt = new Gantt(el, () => "#123456");
    expect(gantt.update([])).toBe(false);
    expect(gantt.update(BARS)).toBe(true);
    const ctx = gantt.canvas.getContext("2d");
    expect(ctx.calls.filter((c) => c[0] === "fillRect")).toHaveLength(4);
    const labels = ctx.calls.filter((c) => c[0] === "fillText").map((c) => c[1]);
    expect(labels).toEqual(expect.arrayContaining(["phases", "spans", "data", "0 s", "20 ms", "40 ms"]));
    gantt.canvas.getBoundingClientRect = () => ({ left: 0, top: 0, width: 450, height: 80 });
    gantt.hover(new MouseEvent("mousemove", { clientX: 100, clientY: 9 }));
    expect(gantt.canvas.title).toContain("data (phases) step 49: 50 ms");
    gantt.destroy();
  });
});
