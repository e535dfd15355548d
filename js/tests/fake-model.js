// A stand-in for the anywidget model: get/set/on/off/save_changes, with listener bookkeeping so
// tests can check that cleanup removes every listener.
export class FakeModel {
  constructor(state = {}) {
    this.state = { ...state };
    /** @type {Map<string, Set<Function>>} */
    this.listeners = new Map();
    this.saved = 0;
    /** @type {any[]} custom messages the view sent */
    this.sent = [];
  }
  send(msg) {
    this.sent.push(msg);
  }
  get(key) {
    return this.state[key];
  }
  set(key, value) {
    this.state[key] = value;
    for (const fn of this.listeners.get(`change:${key}`) ?? []) fn();
  }
  on(event, fn) {
    if (!this.listeners.has(event)) this.listeners.set(event, new Set());
    this.listeners.get(event).add(fn);
  }
  off(event, fn) {
    this.listeners.get(event)?.delete(fn);
  }
  save_changes() {
    this.saved += 1;
  }
  listenerCount() {
    let n = 0;
    for (const set of this.listeners.values()) n += set.size;
    return n;
  }
}

export function baseState(overrides = {}) {
  return {
    header: {
      run: "demo-run",
      backend: "cpu",
      status: "running",
      step: 120,
      total_steps: 1000,
      elapsed_s: 12.5,
      eta_s: 91,
      loss: 0.4321,
      best_loss: 0.4,
      samples_per_s: 2560,
      step_time: 0.025,
    },
    system: {
      cpu_percent: 42,
      process_cpu_percent: 180,
      ram_used_bytes: 8 * 2 ** 30,
      ram_total_bytes: 16 * 2 ** 30,
      process_rss_bytes: 2 ** 30,
    },
    devices: [],
    alerts: [],
    errors: [],
    panels: ["training", "system", "layers", "timeline"],
    panel_training: {},
    panel_system: {},
    panel_layers: {},
    panel_timeline: {},
    ...overrides,
  };
}

/** Run pending requestAnimationFrame callbacks (jsdom's rAF fires on a ~16 ms timer). */
export function nextFrame() {
  return new Promise((resolve) => requestAnimationFrame(() => resolve()));
}

/** An array in the codec, as ipywidgets hands it over: {view: DataView, dtype, shape}. */
export function enc(values, dtype = "float32", shape) {
  const Type = dtype === "float64" ? Float64Array : Float32Array;
  const array = Type.from(values);
  return { view: new DataView(array.buffer), dtype, shape: shape ?? [array.length] };
}

/** A curve {x, y} in the codec. */
export function curve(x, y) {
  return { x: enc(x), y: enc(y) };
}
