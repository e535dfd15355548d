import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { PANELS, panelNamed } from "../src/panels/index.js";
import ranks from "../src/panels/ranks.js";
import timeline, { spanColor } from "../src/panels/timeline.js";
import { enc } from "./fake-model.js";

let el;
beforeEach(() => {
  el = document.createElement("div");
  document.body.append(el);
  globalThis.ImageData ??= class {
    constructor(data, w, h) {
      Object.assign(this, { data, width: w, height: h });
    }
  };
});
afterEach(() => el.remove());

describe("panel registry", () => {
  it("has one module per panel, named as the Python panels", () => {
    expect(PANELS.map((p) => p.name)).toEqual(["training", "system", "memory", "layers", "timeline", "ranks", "devices"]);
    for (const p of PANELS) {
      expect(typeof p.title).toBe("string");
      expect(typeof p.create).toBe("function");
    }
    expect(panelNamed("ranks")).toBe(ranks);
    expect(panelNamed("nope")).toBeUndefined();
  });
});

describe("ranks panel", () => {
  it("draws the ranks x steps heatmap with its title and the three tables", () => {
    const panel = ranks.create(el, { sync: "s" });
    const has = panel.update({
      heat: {
        names: ["rank0 (node0)", "rank1 (node1)"],
        grid: enc([0.05, 0.05, 0.05, 0.5], "float32", [2, 2]),
        steps: enc([1, 2], "float64"),
        title: "step_time per rank (ranks \u00d7 steps)",
        label: "step_time",
      },
      tables: [
        { field: "ranks", title: "Ranks", head: ["rank", "host"], rows: [["0", "node0"], ["1", "node1"]] },
        { field: "summary", title: "Cross-rank summary", head: ["metric"], rows: [["step_time"]] },
      ],
    });
    expect(has).toBe(true);
    const titles = [...el.querySelectorAll(".nbm-section-title")].map((t) => t.textContent);
    expect(titles[0]).toBe("step_time per rank (ranks \u00d7 steps)");
    expect(el.querySelectorAll("table.nbm-ranks-table[data-field=ranks] tbody tr")).toHaveLength(2);
    expect(el.querySelector(".nbm-heatmap-legend").textContent).toContain("step_time");
    panel.destroy();
    expect(el.children).toHaveLength(0);
  });

  it("has nothing to show without a heatmap or tables", () => {
    const panel = ranks.create(el, { sync: "s" });
    expect(panel.update({ heat: {}, tables: [] })).toBe(false);
  });
});

describe("time panel", () => {
  it("stacks the phases, draws the gantt and the summary table", () => {
    const panel = timeline.create(el, { sync: "s" });
    const has = panel.update({
      phases: ["data", "forward"],
      steps: enc([1, 2, 3]),
      seconds: enc([0.01, 0.01, 0.02, 0.005, 0.005, 0.005], "float32", [2, 3]),
      gantt: [["phases", "data", 3, 0, 0.01], ["phases", "forward", 3, 0.01, 0.005]],
      summary: [{ name: "data", kind: "phase", count: 3, mean_s: 0.0133, median_s: 0.01, std_s: 0.005, min_s: 0.01, max_s: 0.02, total_s: 0.04, percent: null }],
    });
    expect(has).toBe(true);
    expect(el.querySelector("[data-chart=phases]").hidden).toBe(false);
    expect(el.querySelector("[data-chart=gantt]").hidden).toBe(false);
    const cells = [...el.querySelectorAll(".nbm-timeline-summary tr:nth-child(2) td")].map((c) => c.textContent);
    expect(cells).toEqual(["3", "13.3 ms", "10 ms", "5 ms", "10 ms", "20 ms", "40 ms", "\u2013"]);
    panel.destroy();
  });

  it("ignores seconds whose shape does not match the phases", () => {
    const panel = timeline.create(el, { sync: "s" });
    const has = panel.update({ phases: ["data"], steps: enc([1, 2]), seconds: enc([1, 2, 3], "float32", [1, 3]), gantt: [], summary: [] });
    expect(has).toBe(false);
  });

  it("colours phases by name and spans by a stable hash", () => {
    expect(spanColor("data")).toBe(spanColor("data"));
    expect(spanColor("load_batch")).toBe(spanColor("load_batch"));
    expect(spanColor("data")).not.toBe(spanColor("forward"));
  });
});

describe("memory panel", () => {
  it("says the headroom and the batch that fits, and nothing while unknown", async () => {
    const { headroomText } = await import("../src/panels/memory.js");
    expect(headroomText({})).toBe("");
    expect(
      headroomText({ memory_peak_bytes: 60 * 2 ** 30, memory_limit_bytes: 80 * 2 ** 30, batch_size: 8, batch_fits: 10 }),
    ).toBe("peak 60.0 GiB of 80.0 GiB (20.0 GiB free); batch 8, up to ~10 estimated to fit");
    const allocator = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";
    expect(headroomText({ allocator })).toBe(`CUDA allocator: ${allocator}`);
    expect(headroomText({ memory_peak_bytes: 2 ** 30, memory_limit_bytes: 2 ** 31, allocator })).toBe(
      `peak 1.00 GiB of 2.00 GiB (1.00 GiB free); CUDA allocator: ${allocator}`,
    );
  });
});

describe("memory panel headroom", () => {
  it("says over N when more than the range of the estimate fits", async () => {
    const { headroomText } = await import("../src/panels/memory.js");
    const notes = { memory_peak_bytes: 2 ** 30, memory_limit_bytes: 2 ** 34, batch_size: 64, batch_fits: 1024 };
    expect(headroomText({ ...notes, batch_fits_more: 1 })).toContain("batch 64, over 1024 estimated to fit");
    expect(headroomText({ ...notes, batch_fits_more: 0 })).toContain("batch 64, up to ~1024 estimated to fit");
  });
});

describe("memory panel charts", () => {
  it("names no MPS driver line on a CPU run, and does on Apple's GPU", async () => {
    const memory = (await import("../src/panels/memory.js")).default;
    const rss = { x: enc([1, 2, 3], "float64"), y: enc([1e9, 1.1e9, 1.2e9], "float64") };
    const cpu = memory.create(el, { sync: "s" });
    expect(cpu.update({ series: { process_rss_bytes: rss }, notes: {} })).toBe(true);
    expect(el.textContent).toContain("this process (RSS)");
    expect(el.textContent).not.toContain("MPS driver");
    cpu.destroy();
    const mps = memory.create(el, { sync: "s" });
    mps.update({ series: { process_rss_bytes: rss, mps_driver_allocated_bytes: rss }, notes: {} });
    expect(el.textContent).toContain("MPS driver");
    mps.destroy();
  });
});

describe("memory panel table", () => {
  it("shows one row per device with its bytes, under a title naming the steps", async () => {
    const memory = (await import("../src/panels/memory.js")).default;
    const panel = memory.create(el, { sync: "s" });
    expect(panel.update({ series: {}, notes: {} })).toBe(false);
    expect(el.querySelector(".nbm-memory-table").hidden).toBe(true);
    const row = { device: "cuda:0", parameters: 2 ** 30, buffers: 0, gradients: 2 ** 30, optimizer_state: 2 ** 31,
      activations: 3 * 2 ** 30, other: 512 * 2 ** 20, measured: 7.5 * 2 ** 30, measured_what: "peak of the last interval" };
    const cpu = { device: "cpu", parameters: 0, buffers: 0, gradients: 0, optimizer_state: 0, activations: 0,
      other: null, measured: null, measured_what: "" };
    const has = panel.update({ series: {}, notes: {}, table: [row, cpu], table_step: 40, activations_step: 30 });
    expect(has).toBe(true);
    expect(el.querySelector(".nbm-memory-title").textContent).toBe("What holds memory (step 40; activations from step 30)");
    expect([...el.querySelectorAll(".nbm-memory-table th")].map((th) => th.textContent)).toEqual([
      "device", "parameters", "buffers", "gradients", "optimizer state", "activations", "other", "measured", "measured as",
    ]);
    const cells = [...el.querySelectorAll(".nbm-memory-table tbody tr")].map((tr) => [...tr.children].map((td) => td.textContent));
    expect(cells).toHaveLength(2);
    expect(cells[0][0]).toBe("cuda:0");
    expect(cells[0][4]).toBe("2.0 GiB");
    expect(cells[1][6]).toBe("\u2013");
    panel.update({ series: {}, notes: {}, table: [row], table_step: 3, activations_step: null });
    expect(el.querySelector(".nbm-memory-title").textContent).toBe("What holds memory (step 3; no activations sampled yet)");
    panel.destroy();
    expect(el.children).toHaveLength(0);
  });
});
