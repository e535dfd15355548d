import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Heatmap, colormap, finiteRange } from "../../src/charts/heatmap.js";
import { middleEllipsis } from "../../src/format.js";

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

describe("heatmap", () => {
  it("maps values onto the ramp over their finite range", () => {
    expect(finiteRange(Float32Array.from([1, Number.NaN, 3]))).toEqual([1, 3]);
    expect(colormap(0)).toEqual([68, 1, 84]);
    expect(colormap(1)).toEqual([253, 231, 37]);
  });

  it("draws one pixel per cell and labels rows with full names and a tooltip", () => {
    const heatmap = new Heatmap(el);
    const names = ["blocks.0.attn.out_proj.weight", "blocks.0.attn.out_proj.bias"];
    heatmap.draw({ values: Float32Array.from([0, 1, 2, 3]), rows: 2, cols: 2, names, steps: Float64Array.from([5, 6]) });
    expect([heatmap.canvas.width, heatmap.canvas.height]).toEqual([2, 2]);
    const put = heatmap.canvas.getContext("2d").calls.filter((c) => c[0] === "putImageData");
    expect(put).toHaveLength(1);
    const labels = [...el.querySelectorAll(".nbm-heatmap-label")];
    expect(labels.map((l) => l.textContent)).toEqual(names);
    expect(labels.map((l) => l.title)).toEqual(names);
    heatmap.canvas.getBoundingClientRect = () => ({ left: 0, top: 0, width: 100, height: 20 });
    heatmap.hover(new MouseEvent("mousemove", { clientX: 80, clientY: 15 }));
    expect(heatmap.canvas.title).toBe("blocks.0.attn.out_proj.bias @ step 6: grad norm 1e3");
    heatmap.destroy();
  });

  it("shortens very long names in the middle, keeping the distinctive end", () => {
    const long = "model.encoder.layers.23.self_attention.out_proj.weight_orig";
    const short = middleEllipsis(long);
    expect(short.length).toBe(44);
    expect(short.endsWith("out_proj.weight_orig")).toBe(true);
    expect(middleEllipsis("fc1.weight")).toBe("fc1.weight");
  });
});
