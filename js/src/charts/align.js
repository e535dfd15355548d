// uPlot draws series that share one x array. The engine decimates each series on its own (the
// points MinMax-LTTB keeps differ per series), so a chart's series are merged on the union of
// their x values, with null where a series has no point (uPlot spans those gaps).

/**
 * @param {{x: ArrayLike<number>, y: ArrayLike<number>}[]} curves each sorted by x
 * @param {{log?: boolean}} [options] log: values <= 0 become gaps
 * @returns {(number | null)[][]} [x, y0, y1, ...]
 */
export function align(curves, options = {}) {
  const clean = (/** @type {number} */ v) => (Number.isFinite(v) && (!options.log || v > 0) ? v : null);
  if (curves.length === 0) return [[]];
  const first = curves[0].x;
  const same = curves.every((c) => c.x.length === first.length && sameValues(c.x, first));
  if (same) {
    return [Array.from(first), ...curves.map((c) => Array.from(c.y, clean))];
  }
  const idx = curves.map(() => 0);
  const xs = [];
  const ys = curves.map(() => /** @type {(number | null)[]} */ ([]));
  for (;;) {
    let next = Infinity;
    curves.forEach((c, k) => {
      if (idx[k] < c.x.length && c.x[idx[k]] < next) next = c.x[idx[k]];
    });
    if (next === Infinity) break;
    xs.push(next);
    curves.forEach((c, k) => {
      if (idx[k] < c.x.length && c.x[idx[k]] === next) {
        ys[k].push(clean(c.y[idx[k]]));
        idx[k] += 1;
      } else {
        ys[k].push(null);
      }
    });
  }
  return [xs, ...ys];
}

/** @param {ArrayLike<number>} a @param {ArrayLike<number>} b */
function sameValues(a, b) {
  if (a === b) return true;
  for (let i = 0; i < a.length; i += 1) if (a[i] !== b[i]) return false;
  return true;
}
