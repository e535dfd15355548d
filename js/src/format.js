// Number formatting for the header and gauges: short, fixed-width-ish, and "–" for missing
// values (the Python side sends null for NaN because JSON has no NaN).

export const DASH = "\u2013";

/** @param {unknown} v */
export function isNum(v) {
  return typeof v === "number" && Number.isFinite(v);
}

/** @param {unknown} v @param {number} [digits] */
export function fmtNumber(v, digits = 4) {
  if (!isNum(v)) return DASH;
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a >= 1e5 || a < 1e-3) return v.toExponential(2);
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  return String(Number(v.toPrecision(digits)));
}

/** @param {unknown} v */
export function fmtInt(v) {
  return isNum(v) ? Math.round(v).toLocaleString("en-US") : DASH;
}

/** @param {unknown} v */
export function fmtPercent(v) {
  return isNum(v) ? `${v.toFixed(v >= 10 ? 0 : 1)}%` : DASH;
}

/** @param {unknown} bytes */
export function fmtBytes(bytes) {
  if (!isNum(bytes)) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = bytes;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(v >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

/** @param {unknown} seconds */
export function fmtDuration(seconds) {
  if (!isNum(seconds) || seconds < 0) return DASH;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  const mm = String(m).padStart(2, "0");
  const ss = String(r).padStart(2, "0");
  return h > 0 ? `${h}:${mm}:${ss}` : `${m}:${ss}`;
}

/** Step time in seconds shown in ms below one second. @param {unknown} seconds */
export function fmtStepTime(seconds) {
  if (!isNum(seconds)) return DASH;
  return seconds < 1 ? `${(seconds * 1000).toPrecision(3)} ms` : `${seconds.toPrecision(3)} s`;
}

/** @param {unknown} joules */
export function fmtJoules(joules) {
  if (!isNum(joules)) return DASH;
  if (joules >= 1000) return `${(joules / 1000).toPrecision(3)} kJ`;
  if (joules < 1) return `${(joules * 1000).toPrecision(3)} mJ`;
  return `${joules.toPrecision(3)} J`;
}
