import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import * as module from "../src/widget.js";
import { sortRows } from "../src/panels/table.js";
import { FakeModel, baseState, curve, enc, nextFrame } from "./fake-model.js";

const widget = module.default;
const render = widget.render;

const field = (el, name) => el.querySelector(`[data-field="${name}"]`)?.textContent;

let el;
beforeEach(() => {
  el = document.createElement("div");
  document.body.append(el);
});
afterEach(() => {
  el.remove();
  vi.restoreAllMocks();
});

describe("render", () => {
  it("uses anywidget's default-export form only (no deprecated named render)", () => {
    expect(typeof widget.render).toBe("function");
    expect("render" in module).toBe(false);
  });

  it("builds the header and the CPU/RAM gauges", () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    expect(el.querySelector(".nbm-run").textContent).toBe("demo-run");
    expect(el.querySelector(".nbm-backend").textContent).toBe("cpu");
    expect(field(el, "status")).toBe("running");
    expect(el.querySelector(".nbm-status").classList.contains("nbm-status-running")).toBe(true);
    expect(field(el, "step")).toBe("120 / 1,000");
    expect(field(el, "loss")).toBe("0.4321");
    expect(field(el, "best_loss")).toBe("0.4");
    expect(field(el, "step_time")).toBe("25.0 ms");
    expect(field(el, "eta")).toBe("1:31");
    expect(field(el, "cpu")).toBe("42%");
    expect(field(el, "ram")).toBe("8.0 GiB / 16.0 GiB");
    expect(el.querySelector(".nbm-card-cpu").textContent).toContain("this process 180%");
    expect(el.querySelectorAll(".nbm-card-gpu").length).toBe(0);
    expect(el.querySelector(".nbm-card-energy")).toBeNull();
    expect(el.querySelector(".nbm-alerts").hidden).toBe(true);
    // No panel has data yet: no tabs.
    expect(el.querySelector(".nbm-tabs").hidden).toBe(true);
  });

  it("labels the CPU gauge as the machine's and the process's figure as of one core", () => {
    render({ model: new FakeModel(baseState()), el });
    const card = el.querySelector(".nbm-card-cpu");
    expect(card.querySelector(".nbm-gauge-label").textContent).toBe("machine");
    expect(field(el, "process_cpu")).toBe("this process 180% of one core");
  });

  it("shows samples/s without token ids and hides TFLOP/s and MFU without a FLOP count", () => {
    render({ model: new FakeModel(baseState()), el });
    const box = (name) => el.querySelector(`[data-field="${name}"]`).parentElement;
    expect(box("samples_per_s").hidden).toBe(false);
    expect(box("tokens_per_s").hidden).toBe(true);
    expect(box("tflops_per_s").hidden).toBe(true);
    expect(box("mfu_percent").hidden).toBe(true);
  });

  it("shows tokens/s, TFLOP/s and MFU, and says why MFU is missing", () => {
    const state = baseState();
    state.header = { ...state.header, tokens_per_s: 51200, tflops_per_s: 312.5, mfu_percent: 31.6 };
    const model = new FakeModel(state);
    render({ model, el });
    const box = (name) => el.querySelector(`[data-field="${name}"]`).parentElement;
    expect(box("samples_per_s").hidden).toBe(true);
    expect(field(el, "tokens_per_s")).toBe("51,200");
    expect(field(el, "tflops_per_s")).toBe("313");
    expect(field(el, "mfu_percent")).toBe("32%");
    const cpu = baseState();
    cpu.header = { ...cpu.header, tflops_per_s: 0.002, mfu_percent: null, mfu_note: "no peak for CPU" };
    el.replaceChildren();
    render({ model: new FakeModel(cpu), el });
    expect(field(el, "mfu_percent")).toBe("\u2013");
    expect(el.querySelector('[data-field="mfu_percent"]').title).toBe("no peak for CPU");
  });

  it("shows the memory peak, the batch that fits and the allocator's settings in the header", () => {
    render({ model: new FakeModel(baseState()), el });
    const box = (name) => el.querySelector(`[data-field="${name}"]`).parentElement;
    expect(box("memory_peak").hidden).toBe(true); // nothing measured: no empty box
    expect(box("batch_fits").hidden).toBe(true);
    expect(el.querySelector('[data-field="allocator"]').hidden).toBe(true);
    const cuda = baseState();
    cuda.header = {
      ...cuda.header,
      memory_peak_bytes: 60 * 2 ** 30,
      memory_limit_bytes: 80 * 2 ** 30,
      batch_size: 8,
      batch_fits: 10.4,
      allocator: "expandable_segments:True",
    };
    el.replaceChildren();
    render({ model: new FakeModel(cuda), el });
    expect(field(el, "memory_peak")).toBe("60.0 GiB / 80.0 GiB");
    expect(box("memory_peak").hidden).toBe(false);
    expect(field(el, "batch_fits")).toBe("~10");
    expect(el.querySelector('[data-field="batch_fits"]').title).toContain("now 8");
    const chip = el.querySelector('[data-field="allocator"]');
    expect(chip.hidden).toBe(false);
    expect(chip.textContent).toBe("expandable_segments:True");
    // A small model on a large memory: a lower bound, said as such.
    const cpu = baseState();
    cpu.header = { ...cpu.header, memory_peak_bytes: 2 ** 28, memory_limit_bytes: 2 ** 34, batch_size: 64, batch_fits: 1024, batch_fits_more: 1 };
    el.replaceChildren();
    render({ model: new FakeModel(cpu), el });
    expect(field(el, "batch_fits")).toBe("over 1,024");
    expect(el.querySelector('[data-field="batch_fits"]').title).toContain("not said beyond 16 times the batch");
  });

  it("shows whether a fine-tune's adapters learn, only for a model with adapters", () => {
    render({ model: new FakeModel(baseState()), el });
    const chip = () => el.querySelector('[data-field="adapters"]');
    expect(chip().hidden).toBe(true);
    const learning = baseState();
    const line = "adapters learning: 4 LoRA matrices, B left zero in 2 of 2 (median norm 0.03)";
    learning.header = { ...learning.header, adapters: line };
    el.replaceChildren();
    render({ model: new FakeModel(learning), el });
    expect(chip().hidden).toBe(false);
    expect(chip().textContent).toBe("adapters learning");
    expect(chip().title).toBe(line);
    expect(chip().classList.contains("nbm-adapters-bad")).toBe(false);
    const stuck = baseState();
    stuck.header = { ...stuck.header, adapters: "adapters NOT learning: 4 LoRA matrices, B stays at zero" };
    el.replaceChildren();
    render({ model: new FakeModel(stuck), el });
    expect(chip().textContent).toBe("adapters NOT learning");
    expect(chip().classList.contains("nbm-adapters-bad")).toBe(true);
  });

  it("shows a dash for null (NaN on the Python side) values", () => {
    const state = baseState();
    state.header = { ...state.header, loss: null, total_steps: null, eta_s: null };
    render({ model: new FakeModel(state), el });
    expect(field(el, "loss")).toBe("\u2013");
    expect(field(el, "step")).toBe("120");
    expect(el.querySelector(".nbm-progress").hidden).toBe(true);
  });

  it("updates the DOM once per animation frame after model changes", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    const raf = vi.spyOn(window, "requestAnimationFrame");
    model.set("header", { ...model.get("header"), step: 121, loss: 0.4 });
    model.set("header", { ...model.get("header"), step: 122, loss: 0.39 });
    model.set("system", { ...model.get("system"), cpu_percent: 97 });
    // Coalesced: three changes, one scheduled redraw, nothing drawn yet.
    expect(raf).toHaveBeenCalledTimes(1);
    expect(field(el, "step")).toBe("120 / 1,000");
    await nextFrame();
    expect(field(el, "step")).toBe("122 / 1,000");
    expect(field(el, "loss")).toBe("0.39");
    expect(field(el, "cpu")).toBe("97%");
    expect(el.querySelector(".nbm-card-cpu .nbm-bar-fill").classList.contains("nbm-crit")).toBe(true);
  });

  it("shows the closed status and hides the ETA", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    model.set("header", { ...model.get("header"), status: "closed" });
    await nextFrame();
    expect(field(el, "status")).toBe("closed");
    expect(el.querySelector(".nbm-status").className).toContain("nbm-status-closed");
    expect(field(el, "eta")).toBe("\u2013");
  });

  it("renders a gauge card per GPU with throttle reasons, and energy", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    model.set("devices", [
      {
        name: "NVIDIA H100",
        util_percent: 88,
        mem_used_bytes: 40 * 2 ** 30,
        mem_total_bytes: 80 * 2 ** 30,
        temperature_c: 61,
        power_w: 420,
        power_limit_w: 700,
        throttle: "sw_power_cap",
      },
      { name: "NVIDIA H100", util_percent: null, mem_used_bytes: null, mem_total_bytes: null, throttle: "" },
    ]);
    model.set("system", { ...model.get("system"), energy_per_step_j: 12.5, energy_per_sample_j: 0.049 });
    await nextFrame();
    const cards = el.querySelectorAll(".nbm-card-gpu");
    expect(cards.length).toBe(2);
    expect(cards[0].textContent).toContain("GPU 0 \u00b7 NVIDIA H100");
    expect(cards[0].textContent).toContain("88%");
    expect(cards[0].textContent).toContain("40.0 GiB / 80.0 GiB");
    expect(cards[0].textContent).toContain("61 \u00b0C \u00b7 420 W / 700 W");
    expect(cards[0].querySelector(".nbm-throttle").textContent).toBe("throttled: sw_power_cap");
    expect(cards[1].querySelector(".nbm-throttle")).toBeNull();
    expect(field(el, "energy_per_step")).toBe("12.5 J / step");
    expect(field(el, "energy_per_sample")).toBe("49.0 mJ / sample");
  });

  it("lists alerts with their layers, and errors", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    model.set("alerts", [
      {
        rule: "vanishing",
        severity: "warning",
        message: "Gradients are vanishing",
        step: 50,
        layers: ["l1", "l2", "l3", "l4", "l5", "l6"],
      },
    ]);
    model.set("errors", ["backend: psutil failed 3 times"]);
    await nextFrame();
    const items = el.querySelectorAll(".nbm-alert");
    expect(items.length).toBe(2);
    expect(items[0].textContent).toContain("Gradients are vanishing (step 50)");
    expect(items[0].querySelector(".nbm-alert-layers").textContent).toBe("in l1, l2, l3, l4 +2 more");
    expect(items[1].classList.contains("nbm-error")).toBe(true);
    expect(el.querySelector(".nbm-alerts").hidden).toBe(false);
  });

  it("shows the newest alerts first, a few at most, without repeating the step", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    const alerts = [1, 2, 3, 4, 5].map((i) => ({ rule: "r", severity: "info", message: `m${i} at step ${i}`, step: i, layers: [] }));
    model.set("alerts", alerts);
    await nextFrame();
    const texts = Array.from(el.querySelectorAll(".nbm-alert")).map((n) => n.textContent);
    expect(texts).toEqual(["m5 at step 5", "m4 at step 4", "m3 at step 3", "+2 earlier alerts (mon.events())"]);
  });

  it("opens an alert on a click: its cause, place, evidence, what it explains and its fix", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    const symptom = { rule: "exploding_gradients", severity: "warning", message: "Gradients explode at step 40", step: 40, layers: [] };
    const cause = {
      rule: "zero_grad_missing",
      severity: "warning",
      message: "optimizer.zero_grad() is never called (grad norm 0.4 to 40). Call it once per step.",
      step: 120,
      layers: [],
      cause: "optimizer.zero_grad() is never called: gradients add up across steps",
      evidence: { grad_norm: [0.4, 40], growth_per_step: 0.33, first_step: 1, symptoms: [{ rule: "exploding_gradients", step: 40 }] },
      place: "param group 0",
      fix: "call optimizer.zero_grad() once per step",
      explains: [["exploding_gradients", 40]],
    };
    model.set("alerts", [symptom, cause]);
    await nextFrame();
    // The symptom the cause took in is not listed on its own: the cause shows it.
    const items = el.querySelectorAll(".nbm-alert");
    expect(items.length).toBe(1);
    const details = items[0].querySelector("details");
    expect(details.open).toBe(false);
    expect(items[0].querySelector("summary").textContent).toBe(cause.message);
    details.querySelector("summary").click();
    expect(details.open).toBe(true);
    const rows = Array.from(details.querySelectorAll(".nbm-alert-row")).map((r) => r.textContent);
    expect(rows).toEqual([
      `cause${cause.cause}`,
      "whereparam group 0",
      "explainsexploding_gradients (step 40)",
      "fixcall optimizer.zero_grad() once per step",
    ]);
    const terms = Array.from(details.querySelectorAll(".nbm-evidence dt")).map((n) => n.textContent);
    const values = Array.from(details.querySelectorAll(".nbm-evidence dd")).map((n) => n.textContent);
    expect(terms).toEqual(["grad norm", "growth per step", "first step"]);
    expect(values).toEqual(["0.4, 40", "0.33", "1"]);
    // Opened, it stays open when a new alert redraws the strip.
    details.dispatchEvent(new Event("toggle"));
    model.set("alerts", [symptom, cause, { rule: "r", severity: "info", message: "m", step: 130, layers: [] }]);
    await nextFrame();
    const again = Array.from(el.querySelectorAll(".nbm-alert details"));
    expect(again.length).toBe(1);
    expect(again[0].open).toBe(true);
    expect(el.querySelectorAll(".nbm-alert")[0].textContent).toBe("m (step 130)");
  });

  it("says when an opened alert is a symptom with no cause found", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    model.set("alerts", [
      { rule: "loss_plateau", severity: "warning", message: "The loss stopped falling", step: 200, layers: [], cause: "", evidence: { drop: 0.01, huge: "x".repeat(5) }, fix: "try another lr" },
    ]);
    await nextFrame();
    const rows = Array.from(el.querySelectorAll(".nbm-alert-row")).map((r) => r.textContent);
    expect(rows).toEqual(["symptomno cause found that explains it", "fixtry another lr"]);
    expect(module.evidenceText([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])).toBe("1, 2, 3, 4, 5, 6, 7, 8 +2 more");
    expect(module.evidenceText({ a_b: 1e-9, c: null, d: { e: { f: { g: 1 } } } })).toBe("a b 1.00e-9; c \u2013; d e f \u2026");
  });

  it("draws the per-layer heatmap from binary buffers and a sortable, flagged table", async () => {
    const put = vi.fn();
    vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockReturnValue({ putImageData: put });
    globalThis.ImageData ??= class {
      constructor(data, w, hgt) {
        Object.assign(this, { data, width: w, height: hgt });
      }
    };
    const model = new FakeModel(baseState());
    render({ model, el });
    const layers = {
      names: ["fc1.weight", "out_proj.weight_orig"],
      grid: enc([-1, -2, Number.NaN, 0, 1, 2], "float32", [2, 3]), // 2 layers x 3 steps
      steps: enc([10, 20, 30], "float64"),
      table: [
        { name: "fc1.weight", shape: [4, 8], numel: 32, dtype: "float32", grad_norm: 0.1, param_norm: 2, update_ratio: 1e-3, flags: [] },
        { name: "out_proj.weight_orig", shape: [8, 1], numel: 8, dtype: "float32", grad_norm: 100, param_norm: 1, update_ratio: null, flags: ["exploding"] },
      ],
    };
    model.set("panel_layers", layers);
    await nextFrame();
    const box = el.querySelector('.nbm-panel[data-panel="layers"]');
    expect(box.hidden).toBe(false); // the only panel with data is shown
    expect(el.querySelector('.nbm-tab[data-tab="layers"]').hidden).toBe(false);
    const canvas = box.querySelector("canvas");
    expect([canvas.width, canvas.height]).toEqual([3, 2]);
    expect(put).toHaveBeenCalledTimes(1);
    const image = put.mock.calls[0][0];
    // NaN cell transparent, the largest value bright yellow.
    expect(image.data[2 * 4 + 3]).toBe(0);
    expect(Array.from(image.data.slice(5 * 4, 5 * 4 + 4))).toEqual([253, 231, 37, 255]);
    const legend = el.querySelector(".nbm-heatmap-legend").textContent;
    expect(legend).toContain("-2");
    expect(legend).toContain("steps 10\u201330");
    // Full names, underscores kept, the whole name in the tooltip.
    const labels = Array.from(el.querySelectorAll(".nbm-heatmap-label"));
    expect(labels.map((n) => n.textContent)).toEqual(["fc1.weight", "out_proj.weight_orig"]);
    expect(labels[1].title).toBe("out_proj.weight_orig");

    const rows = () => Array.from(el.querySelectorAll(".nbm-table tbody tr"));
    expect(rows().map((r) => r.firstChild.textContent)).toEqual(["fc1.weight", "out_proj.weight_orig"]);
    expect(rows()[1].classList.contains("nbm-flagged")).toBe(true);
    expect(rows()[1].querySelector(".nbm-flag").textContent).toBe("exploding");
    expect(rows()[0].children[1].textContent).toBe("(4, 8)");
    // Click "grad norm": largest first; click again: ascending.
    const th = el.querySelector('th[data-key="grad_norm"]');
    th.click();
    expect(rows()[0].firstChild.textContent).toBe("out_proj.weight_orig");
    th.click();
    expect(rows()[0].firstChild.textContent).toBe("fc1.weight");
    // Sorting survives a data update.
    model.set("panel_layers", { ...layers });
    await nextFrame();
    expect(rows()[0].firstChild.textContent).toBe("fc1.weight");
  });

  it("does not draw a heatmap whose buffer does not match its shape", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    model.set("panel_layers", { names: ["a"], grid: enc([1, 2, 3], "float32", [1, 4]), steps: enc([1, 2, 3, 4], "float64"), table: [] });
    await nextFrame();
    expect(el.querySelector(".nbm-heatmap-canvas").width).toBe(1);
  });

  it("shows a tab per panel with data, keeps the user's choice, and draws curves", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    model.set("panel_training", { series: { loss: curve([1, 2, 3], [3, 2, 1]) }, notes: { grad_norm: "" } });
    model.set("panel_system", { series: { cpu_percent: curve([1, 2], [10, 20]) }, notes: { devices: [] } });
    await nextFrame();
    const tabs = () => Array.from(el.querySelectorAll(".nbm-tab")).filter((t) => !t.hidden).map((t) => t.textContent);
    expect(tabs()).toEqual(["Training", "System"]);
    expect(el.querySelector(".nbm-tabs").hidden).toBe(false);
    const training = el.querySelector('.nbm-panel[data-panel="training"]');
    expect(training.hidden).toBe(false);
    const loss = training.querySelector('[data-chart="loss"]');
    expect(loss.hidden).toBe(false);
    expect(loss.querySelector("canvas")).not.toBeNull();
    expect(training.querySelector('[data-chart="lr"]').hidden).toBe(true); // no lr series
    el.querySelector('.nbm-tab[data-tab="system"]').click();
    expect(el.querySelector('.nbm-panel[data-panel="system"]').hidden).toBe(false);
    expect(training.hidden).toBe(true);
    model.set("panel_training", { series: { loss: curve([1, 2, 3, 4], [3, 2, 1, 0.5]) }, notes: {} });
    await nextFrame();
    expect(training.hidden).toBe(true); // the user's tab stays
  });

  it("shows the first panel in tab order that has data until the user picks one", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    model.set("panel_system", { series: { cpu_percent: curve([1, 2], [10, 20]) }, notes: { devices: [] } });
    await nextFrame();
    const shown = () => el.querySelector(".nbm-panel:not([hidden])")?.dataset.panel;
    expect(shown()).toBe("system"); // the machine is sampled before the first step ends
    model.set("panel_training", { series: { loss: curve([1], [3]) }, notes: {} });
    await nextFrame();
    expect(shown()).toBe("training");
  });

  it("puts the clipping summary in the gradient-norm title", async () => {
    const model = new FakeModel(baseState());
    render({ model, el });
    model.set("panel_training", {
      series: { grad_norm: curve([1, 2], [3, 4]) },
      notes: { grad_norm: "clipped on 50% of recent steps, coef 0.25" },
    });
    await nextFrame();
    const title = el.querySelector('[data-chart="grad_norm"] .nbm-chart-title').textContent;
    expect(title).toBe("Gradient norm: clipped on 50% of recent steps, coef 0.25");
  });

  it("cleans up: removes listeners, cancels the pending frame and the DOM", async () => {
    const model = new FakeModel(baseState());
    const cleanup = render({ model, el });
    expect(model.listenerCount()).toBeGreaterThan(0);
    const cancel = vi.spyOn(window, "cancelAnimationFrame");
    model.set("header", { ...model.get("header"), step: 999 });
    cleanup();
    expect(model.listenerCount()).toBe(0);
    expect(cancel).toHaveBeenCalled();
    expect(el.children.length).toBe(0);
    model.set("header", { ...model.get("header"), step: 1000 });
    await nextFrame();
    expect(el.textContent).toBe("");
  });
});

describe("sortRows", () => {
  it("keeps missing values last in both directions", () => {
    const rows = [{ v: 2 }, { v: null }, { v: 5 }, { v: Number.NaN }];
    expect(sortRows(rows, "v", 1).map((r) => r.v)).toEqual([2, 5, null, Number.NaN]);
    expect(sortRows(rows, "v", -1).map((r) => r.v)).toEqual([5, 2, null, Number.NaN]);
  });
});
