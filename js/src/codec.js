// The one binary codec of the widget traits: an array travels as {view, dtype, shape} (see
// nbmonitor/ui/codec.py); `view` arrives as a DataView over the message buffer.

import { toTypedArray } from "./binary.js";

/**
 * @param {{view: any, dtype: "float32" | "float64", shape?: number[]} | null | undefined} value
 * @returns {Float32Array | Float64Array}
 */
export function decode(value) {
  if (!value || value.view == null) return new Float32Array(0);
  const array = toTypedArray(value.view, value.dtype ?? "float32");
  const shape = Array.isArray(value.shape) ? value.shape : [array.length];
  const size = shape.reduce((a, b) => a * b, 1);
  // A truncated buffer draws nothing rather than a shifted picture.
  return array.length === size ? array : array.subarray(0, 0);
}

/** @param {any} value @returns {number[]} */
export function shapeOf(value) {
  return value && Array.isArray(value.shape) ? value.shape.map(Number) : [];
}
