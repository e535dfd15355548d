// Decoding of binary traits. ipywidgets hands a `Bytes` trait to the front end as a DataView
// over the message buffer; tests and older managers may hand an ArrayBuffer or a typed array.
// The view's byteOffset is not always a multiple of the element size, which a typed-array
// constructor rejects, so unaligned data is copied once.

const TYPES = {
  float32: Float32Array,
  float64: Float64Array,
};

/**
 * @param {DataView | ArrayBuffer | ArrayBufferView | null | undefined} value
 * @param {"float32" | "float64"} dtype
 * @returns {Float32Array | Float64Array}
 */
export function toTypedArray(value, dtype) {
  const Type = TYPES[dtype];
  if (!Type) throw new Error(`nbmonitor: unsupported dtype ${dtype}`);
  if (value == null) return new Type(0);
  let buffer;
  let offset = 0;
  let length;
  if (value instanceof ArrayBuffer) {
    buffer = value;
    length = value.byteLength;
  } else if (ArrayBuffer.isView(value)) {
    buffer = /** @type {ArrayBuffer} */ (value.buffer);
    offset = value.byteOffset;
    length = value.byteLength;
  } else {
    throw new Error("nbmonitor: expected binary data");
  }
  const size = Type.BYTES_PER_ELEMENT;
  const count = Math.floor(length / size);
  if (offset % size === 0) return new Type(buffer, offset, count);
  return new Type(buffer.slice(offset, offset + count * size));
}
