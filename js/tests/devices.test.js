import { afterEach, beforeEach, describe, expect, it } from "vitest";
import * as module from "../src/devices.js";

const { bytes, sparkline } = module;
const devices = module.default;
const render = devices.render;
import { FakeModel } from "./fake-model.js";

const GPU = {
  index: 0,
  name: "NVIDIA H100",
  values: { util_percent: 87, mem_used_bytes: 30 * 2 ** 30, mem_total_bytes: 80 * 2 ** 30, temperature_c: 91, power_w: 350, power_limit_w: 700, pcie_gen: 5, pcie_width: 16, nvlink_links: 18 },
  throttle: "hw_thermal_slowdown",
  grades: { temperature_c: "alert", mem_used_bytes: "ok", throttle: "alert" },
  processes: [{ pid: 4242, name: "python3", used_bytes: 2 ** 30 }],
  spark: { util_percent: [10, null, 50, 87] },
};
const STATE = {
  host: "node1", status: "running", interval: 1, gpus: [GPU],
  machine: { cpu_percent: 12, ram_used_bytes: 2 ** 30, ram_total_bytes: 2 ** 32, disk_read_bytes_per_s: null },
  spark: {}, alerts: [{ severity: "warning", message: "GPU 0 is at 91 °C" }], notes: [], errors: [],
};

let el;
beforeEach(() => {
  el = document.createElement("div");
  document.body.append(el);
});
afterEach(() => el.remove());

describe("devices panel", () => {
  it("uses anywidget's default-export form only (no deprecated named render)", () => {
    expect(typeof devices.render).toBe("function");
    expect("render" in module).toBe(false);
  });

  it("draws a card per GPU with its grades, processes and links, then the machine", () => {
    const model = new FakeModel({ state: STATE });
    render({ model, el });
    const card = el.querySelector("[data-gpu='0']");
    expect(card.querySelector("h4").textContent).toBe("GPU 0 · NVIDIA H100");
    expect(card.querySelectorAll(".nbm-grade-alert").length).toBe(2); // temperature, throttle
    expect(card.textContent).toContain("PCIe gen5 x16 · NVLink 18 links");
    expect(card.querySelector(".nbm-dev-procs").textContent).toContain("python3");
    expect(el.querySelector(".nbm-dev-machine").textContent).toContain("disk read -");
    expect(el.querySelector(".nbm-dev-alerts").textContent).toContain("91 °C");
  });

  it("redraws on a new state and removes its listener at cleanup", () => {
    const model = new FakeModel({ state: STATE });
    const cleanup = render({ model, el });
    model.set("state", { ...STATE, gpus: [GPU, { ...GPU, index: 1 }] });
    expect(el.querySelectorAll(".nbm-dev-card[data-gpu]").length).toBe(2);
    cleanup();
    expect(model.listenerCount()).toBe(0);
    expect(el.children.length).toBe(0);
  });

  it("formats bytes and skips missing points in sparklines", () => {
    expect(bytes(1536)).toBe("1.5 KiB");
    expect(bytes(null)).toBe("-");
    const svg = sparkline([1, null, 3]);
    expect(svg.querySelector("polyline").getAttribute("points").split(" ").length).toBe(2);
    expect(sparkline([null, 1]).querySelector("polyline")).toBeNull();
  });
});
