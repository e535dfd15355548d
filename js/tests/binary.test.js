import { describe, expect, it } from "vitest";
import { toTypedArray } from "../src/binary.js";

describe("toTypedArray", () => {
  it("decodes a DataView over float32 data", () => {
    const src = new Float32Array([1.5, -2, Number.NaN]);
    const out = toTypedArray(new DataView(src.buffer), "float32");
    expect(out).toBeInstanceOf(Float32Array);
    expect(Array.from(out.slice(0, 2))).toEqual([1.5, -2]);
    expect(Number.isNaN(out[2])).toBe(true);
  });

  it("decodes an ArrayBuffer of float64", () => {
    const src = new Float64Array([1e-12, 3, 1e6]);
    const out = toTypedArray(src.buffer, "float64");
    expect(out).toBeInstanceOf(Float64Array);
    expect(Array.from(out)).toEqual([1e-12, 3, 1e6]);
  });

  it("copies unaligned views instead of throwing", () => {
    // A message buffer where the payload starts at byte 1: Float64Array(buffer, 1) would throw.
    const raw = new Uint8Array(1 + 16);
    new DataView(raw.buffer).setFloat64(1, 7.25, true);
    new DataView(raw.buffer).setFloat64(9, -1, true);
    const out = toTypedArray(new DataView(raw.buffer, 1, 16), "float64");
    expect(Array.from(out)).toEqual([7.25, -1]);
  });

  it("respects the view's offset and length", () => {
    const src = new Float32Array([9, 1, 2, 9]);
    const view = new DataView(src.buffer, 4, 8);
    expect(Array.from(toTypedArray(view, "float32"))).toEqual([1, 2]);
  });

  it("treats missing data as empty and rejects unknown dtypes", () => {
    expect(toTypedArray(null, "float32").length).toBe(0);
    expect(() => toTypedArray(new ArrayBuffer(4), "int8")).toThrow(/dtype/);
  });
});
