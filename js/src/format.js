// Number formatting for the header and gauges: short, fixed-width-ish, and "–" for missing
// values (the Python side sends null for NaN because JSON has no NaN).

export const DASH = "\u2013";

/**
 * @param {unknown} v
 * @returns {v is number}
 */
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

// -- chart ticks and read-outs: short SI forms (18k, 3e-4, 1.2 GiB, 45 ms) -----------------------

/**
 * Trim a fixed/precision string's trailing zeros: "1.50" -> "1.5", "2.00e-4" -> "2e-4".
 * @param {string} s
 */
function trim(s) {
  const [mantissa, exponent] = s.split("e");
  const m = mantissa.includes(".") ? mantissa.replace(/\.?0+$/, "") : mantissa;
  return exponent === undefined ? m : `${m}e${exponent.replace("+", "")}`;
}

/** A short number: 18k, 1.2M, 0.25, 3e-4. @param {unknown} v @param {number} [digits] */
export function si(v, digits = 3) {
  if (!isNum(v)) return DASH;
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a < 1e-2) return trim(v.toExponential(digits - 1));
  /** @type {[number, string][]} */
  const scales = [
    [1e12, "T"],
    [1e9, "G"],
    [1e6, "M"],
    [1e3, "k"],
  ];
  for (const [limit, suffix] of scales) {
    if (a >= limit) return `${trim((v / limit).toPrecision(digits))}${suffix}`;
  }
  return trim(v.toPrecision(digits));
}

/** Bytes with a binary unit: 1.2 GiB. @param {unknown} v */
export function siBytes(v, digits = 3) {
  if (!isNum(v)) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let x = v;
  let i = 0;
  while (Math.abs(x) >= 1024 && i < units.length - 1) {
    x /= 1024;
    i += 1;
  }
  return `${trim(x.toPrecision(digits))} ${units[i]}`;
}

/** Seconds as µs / ms / s / min: 45 ms. @param {unknown} v */
export function siSeconds(v, digits = 3) {
  if (!isNum(v)) return DASH;
  const a = Math.abs(v);
  if (a === 0) return "0 s";
  if (a < 1e-3) return `${trim((v * 1e6).toPrecision(digits))} \u00b5s`;
  if (a < 1) return `${trim((v * 1e3).toPrecision(digits))} ms`;
  if (a < 120) return `${trim(v.toPrecision(digits))} s`;
  return `${trim((v / 60).toPrecision(digits))} min`;
}

/**
 * The formatter of a unit: "" (SI), "bytes", "s", "%", or any other suffix ("W", "°C").
 * @param {string} unit @returns {(v: unknown) => string}
 */
export function formatter(unit) {
  if (unit === "bytes") return siBytes;
  if (unit === "s") return siSeconds;
  if (!unit) return (v) => si(v);
  return (v) => (isNum(v) ? `${si(v)}${unit === "%" ? "%" : ` ${unit}`}` : DASH);
}

/**
 * Tick labels. Ticks are round numbers (1, 2, 2.5, 5 x 10^n steps), so four significant digits
 * with trailing zeros trimmed write them exactly ("1.25 GiB", "18k", "1.01e-2"); more digits only
 * where neighbours would otherwise read the same.
 * @param {number[]} ticks @param {string} unit @returns {string[]}
 */
export function tickLabels(ticks, unit) {
  // uPlot passes null for a tick its axis filter dropped: no label there.
  if (ticks.some((t) => t == null || !Number.isFinite(t))) {
    const kept = ticks.filter((t) => t != null && Number.isFinite(t));
    const labels = tickLabels(kept, unit);
    let i = 0;
    return ticks.map((t) => (t != null && Number.isFinite(t) ? labels[i++] : ""));
  }
  // One form per axis: where a tick needs an exponent (3e-4), every tick gets one.
  // A tick that is zero but for rounding (5.6e-17) is written 0.
  const top = Math.max(0, ...ticks.map((t) => Math.abs(t)));
  ticks = ticks.map((t) => (Math.abs(t) < top * 1e-9 ? 0 : t));
  const small = unit !== "bytes" && unit !== "s" && ticks.some((t) => t !== 0 && Math.abs(t) < 1e-2);
  for (let digits = 4; digits <= 6; digits += 1) {
    const labels = ticks.map((t) =>
      small && t !== 0 ? `${trim(t.toExponential(digits - 1))}${unit ? (unit === "%" ? "%" : ` ${unit}`) : ""}` : formatDigits(t, unit, digits),
    );
    if (new Set(labels).size === labels.length) return labels;
  }
  return ticks.map((t) => formatDigits(t, unit, 6));
}

/** @param {number} v @param {string} unit @param {number} digits */
function formatDigits(v, unit, digits) {
  if (unit === "bytes") return siBytes(v, digits);
  if (unit === "s") return siSeconds(v, digits);
  if (!unit) return si(v, digits);
  return `${si(v, digits)}${unit === "%" ? "%" : ` ${unit}`}`;
}

/**
 * Ticks for a bytes axis in round binary units (0, 512 MiB, 1 GiB, ...), about `count` of them.
 * @param {number} min @param {number} max @param {number} [count]
 */
export function byteTicks(min, max, count = 4) {
  if (!(max > min)) return [min];
  let unit = 1;
  while (unit * 1024 <= Math.max(Math.abs(min), Math.abs(max))) unit *= 1024;
  const span = (max - min) / unit;
  const raw = span / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = ([1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => span / s <= count) ?? 10 * mag) * unit;
  const ticks = [];
  for (let t = Math.ceil(min / step) * step; t <= max + step * 1e-9; t += step) ticks.push(t);
  return ticks;
}

/** A layer name shown whole when it fits, else its start and its distinctive end. */
export function middleEllipsis(name, max = 44) {
  const s = String(name);
  if (s.length <= max) return s;
  const tail = Math.ceil((max - 1) * 0.6);
  return `${s.slice(0, max - 1 - tail)}\u2026${s.slice(s.length - tail)}`;
}
