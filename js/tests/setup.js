// jsdom has no canvas 2D context, Path2D or matchMedia: stand-ins that record what is drawn, so
// that chart tests can run uPlot and our canvas charts and check what they asked to draw.

export function fakeContext() {
  const calls = [];
  const target = {
    calls,
    measureText: (/** @type {string} */ text) => ({ width: String(text).length * 6 }),
    getImageData: () => ({ data: new Uint8ClampedArray(4) }),
    createLinearGradient: () => ({ addColorStop() {} }),
  };
  return new Proxy(target, {
    get(t, key) {
      if (key in t) return t[key];
      return (...args) => {
        calls.push([key, ...args]);
      };
    },
    set(t, key, value) {
      t[key] = value;
      return true;
    },
  });
}

const contexts = new WeakMap();
HTMLCanvasElement.prototype.getContext = function getContext() {
  if (!contexts.has(this)) contexts.set(this, fakeContext());
  return contexts.get(this);
};

globalThis.Path2D ??= class Path2D {
  constructor() {
    this.ops = [];
  }
  moveTo(...a) { this.ops.push(["moveTo", ...a]); }
  lineTo(...a) { this.ops.push(["lineTo", ...a]); }
  rect(...a) { this.ops.push(["rect", ...a]); }
  arc(...a) { this.ops.push(["arc", ...a]); }
  bezierCurveTo(...a) { this.ops.push(["bezierCurveTo", ...a]); }
  quadraticCurveTo(...a) { this.ops.push(["quadraticCurveTo", ...a]); }
  closePath() { this.ops.push(["closePath"]); }
  addPath(p) { this.ops.push(["addPath", p]); }
};

globalThis.matchMedia ??= () => ({
  matches: false,
  addEventListener() {},
  removeEventListener() {},
  addListener() {},
  removeListener() {},
});
window.matchMedia ??= globalThis.matchMedia;
