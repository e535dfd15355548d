import { afterEach, beforeEach, describe, expect, it } from "vitest";
import widget from "../src/widget.js";
import { SteerBar, parseLr, steerText } from "../src/steer.js";
import { FakeModel, baseState, nextFrame } from "./fake-model.js";

let el;
beforeEach(() => {
  el = document.createElement("div");
  document.body.append(el);
});
afterEach(() => el.remove());

const click = (root, action) => root.querySelector(`[data-steer="${action}"]`).click();
const shown = (root, action) => !root.querySelector(`[data-steer="${action}"]`).hidden;
const said = (root) => root.querySelector('[data-field="steer"]').textContent;

describe("steering bar", () => {
  it("is hidden without steering (a replay) and shown on a live run", async () => {
    const model = new FakeModel(baseState());
    widget.render({ model, el });
    expect(el.querySelector(".nbm-steer").hidden).toBe(true);
    model.set("steer", { enabled: true, state: "running", step: 3 });
    await nextFrame();
    expect(el.querySelector(".nbm-steer").hidden).toBe(false);
    expect(shown(el, "pause")).toBe(true);
    expect(shown(el, "resume")).toBe(false);
  });

  it("sends one message per click; stop only after the confirmation", async () => {
    const model = new FakeModel({ ...baseState(), steer: { enabled: true, state: "running", step: 3 } });
    widget.render({ model, el });
    click(el, "pause");
    expect(model.sent).toEqual([{ type: "steer", kind: "pause" }]);
    expect(said(el)).toBe("pausing after this step\u2026");
    click(el, "stop");
    expect(model.sent.length).toBe(1); // asked, not sent
    expect(shown(el, "confirm-stop")).toBe(true);
    click(el, "cancel-stop");
    expect(model.sent.length).toBe(1);
    expect(shown(el, "stop")).toBe(true);
    click(el, "stop");
    click(el, "confirm-stop");
    expect(model.sent.at(-1)).toEqual({ type: "steer", kind: "stop" });
    click(el, "checkpoint");
    expect(model.sent.at(-1)).toEqual({ type: "steer", kind: "checkpoint" });
  });

  it("sends a typed learning rate, and refuses one that is not a positive number", () => {
    const model = new FakeModel({ ...baseState(), steer: { enabled: true, state: "running", step: 3 } });
    widget.render({ model, el });
    const input = el.querySelector('[data-field="lr-input"]');
    input.value = "abc";
    click(el, "lr");
    expect(model.sent.length).toBe(0);
    expect(input.classList.contains("nbm-steer-bad")).toBe(true);
    input.value = "3e-4";
    click(el, "lr");
    expect(model.sent).toEqual([{ type: "steer", kind: "lr", value: 3e-4 }]);
  });

  it("says paused at the step, offers resume, and says stopped without controls", async () => {
    const model = new FakeModel({ ...baseState(), steer: { enabled: true, state: "paused", step: 41 } });
    widget.render({ model, el });
    expect(said(el)).toBe("paused at step 41");
    expect(shown(el, "resume")).toBe(true);
    expect(shown(el, "pause")).toBe(false);
    model.set("steer", { enabled: false, state: "stopped", step: 42 });
    await nextFrame();
    expect(said(el)).toBe("stopped at step 42");
    expect(el.querySelector(".nbm-steer-controls").hidden).toBe(true);
  });

  it("clears a pending checkpoint once a later step shows", () => {
    const sent = [];
    const bar = new SteerBar((m) => sent.push(m));
    bar.draw({ enabled: true, state: "running", step: 5 });
    bar.request("checkpoint");
    expect(bar.text.textContent).toBe("checkpoint after this step\u2026");
    bar.draw({ enabled: true, state: "running", step: 5 });
    expect(bar.pending).toBe("checkpoint");
    bar.draw({ enabled: true, state: "running", step: 6 });
    expect(bar.text.textContent).toBe("");
  });
});

describe("parseLr and steerText", () => {
  it("parses positive finite numbers only", () => {
    expect(parseLr("0.001")).toBe(0.001);
    expect(parseLr(" 1e-3 ")).toBe(0.001);
    for (const bad of ["", "0", "-1", "nan", "inf", "1e999", "x"]) expect(parseLr(bad)).toBeNull();
  });
  it("words each state", () => {
    expect(steerText({ state: "stopping" }, "")).toBe("stopping after this step\u2026");
    expect(steerText({ state: "running" }, "")).toBe("");
    expect(steerText({ state: "paused", step: 7 }, "resume")).toBe("resuming\u2026");
  });
});

describe("lr marks", () => {
  it("marks the learning rates asked on the lr chart", async () => {
    const { panelNamed } = await import("../src/panels/index.js");
    const { curve } = await import("./fake-model.js");
    const panel = panelNamed("training").create(el, { sync: "t" });
    const state = { series: { lr: curve([0, 1, 2, 3], [0.1, 0.1, 0.01, 0.01]) }, notes: {} };
    panel.update({ ...state, marks: { lr: [[2, 0.01]] } });
    const chart = el.querySelector('[data-chart="lr"]');
    expect(chart.dataset.marks).toBe("1");
    expect(chart.querySelector(".nbm-chart-title").title).toContain("set to 0.01 at step 2");
    panel.update(state);
    expect(chart.dataset.marks).toBe("0");
    panel.destroy();
  });
});
