import { afterEach, beforeEach, describe, expect, it } from "vitest";
import * as module from "../src/panels/profile.js";

const profile = module.default;
const render = profile.render;
import { FakeModel } from "./fake-model.js";

const COLUMNS = [
  { key: "name", label: "operator", kind: "text" },
  { key: "calls", label: "calls", kind: "int" },
  { key: "self_cpu_ms", label: "self CPU (ms)", kind: "num" },
  { key: "self_cpu_memory_bytes", label: "self CPU memory", kind: "bytes" },
];

const ROWS = [
  { name: "aten::mm", calls: 38, self_cpu_ms: 12.5, self_cpu_memory_bytes: 491520 },
  { name: "aten::addmm", calls: 16, self_cpu_ms: 3.25, self_cpu_memory_bytes: 2048 },
  { name: "aten::gelu", calls: 8, self_cpu_ms: 7.0, self_cpu_memory_bytes: null },
];

let el;
beforeEach(() => {
  el = document.createElement("div");
  document.body.append(el);
});
afterEach(() => el.remove());

const cells = (col) => [...el.querySelectorAll("tbody tr")].map((tr) => tr.children[col].textContent);

describe("profile table", () => {
  it("is the default export's render", () => {
    expect(typeof profile.render).toBe("function");
    expect("render" in module).toBe(false); // no deprecated named export
  });

  it("shows the status until rows come, then a table in the engine's order", () => {
    const model = new FakeModel({ status: "waiting for the next step", columns: COLUMNS, rows: [] });
    render({ model, el });
    expect(el.querySelector(".nbm-profile-status").textContent).toBe("waiting for the next step");
    expect(el.querySelector("table")).toBeNull();
    model.set("title", "torch.profiler, steps 5-6");
    model.set("trace_path", "/runs/x/profiles/steps-5-6.pt.trace.json");
    model.set("status", "");
    model.set("rows", ROWS);
    expect(el.querySelector(".nbm-profile-status").hidden).toBe(true);
    expect(el.querySelector(".nbm-section-title").textContent).toBe("torch.profiler, steps 5-6");
    expect(el.querySelector(".nbm-profile-trace").textContent).toContain("steps-5-6.pt.trace.json");
    expect([...el.querySelectorAll("th")].map((th) => th.textContent)).toEqual(COLUMNS.map((c) => c.label));
    expect(cells(0)).toEqual(["aten::mm", "aten::addmm", "aten::gelu"]);
    expect(cells(3)).toEqual(["480 KiB", "2.0 KiB", "\u2013"]);
  });

  it("sorts by a clicked column, numbers descending first, names ascending", () => {
    render({ model: new FakeModel({ columns: COLUMNS, rows: ROWS }), el });
    const th = (key) => el.querySelector(`th[data-key="${key}"]`);
    th("self_cpu_ms").dispatchEvent(new MouseEvent("click", { bubbles: true }));
    expect(cells(0)).toEqual(["aten::mm", "aten::gelu", "aten::addmm"]);
    th("self_cpu_ms").dispatchEvent(new MouseEvent("click", { bubbles: true }));
    expect(cells(0)).toEqual(["aten::addmm", "aten::gelu", "aten::mm"]);
    th("name").dispatchEvent(new MouseEvent("click", { bubbles: true }));
    expect(cells(0)).toEqual(["aten::addmm", "aten::gelu", "aten::mm"]);
  });

  it("shows an error and cleans up", () => {
    const model = new FakeModel({ error: "another torch profiler is running", columns: COLUMNS, rows: [] });
    const cleanup = render({ model, el });
    expect(el.querySelector(".nbm-profile-error").textContent).toBe("another torch profiler is running");
    cleanup();
    expect(el.querySelector(".nbm-profile")).toBeNull();
    expect(model.listenerCount()).toBe(0);
  });
});
