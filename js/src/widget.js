// nbmonitor dashboard (anywidget ESM): a header, gauges and alerts, then one tab per panel
// (js/src/panels/, drawn with our canvas charts), all in this one widget: nothing is fetched at
// run time, so it renders wherever anywidget does (JupyterLab, Notebook 7, VS Code, Colab,
// marimo).
//
// The sampler may publish several times per second; every model change only marks a section
// dirty and one requestAnimationFrame redraws what changed, so bursts cost one redraw.

import {
  DASH,
  fmtBytes,
  fmtDuration,
  fmtInt,
  fmtJoules,
  fmtNumber,
  fmtPercent,
  fmtStepTime,
  isNum,
} from "./format.js";
import { PANELS, panelNamed } from "./panels/index.js";
import { SteerBar } from "./steer.js";

/** Traits this view reads, and the section each one dirties (panel traits: see panelTrait). */
export const SECTIONS = {
  header: ["header"],
  system: ["gauges"],
  devices: ["gauges"],
  alerts: ["alerts"],
  errors: ["alerts"],
  panels: ["tabs"],
  steer: ["steer"],
};

/** @param {string} name */
export const panelTrait = (name) => `panel_${name}`;

/**
 * @param {string} tag @param {string} [className] @param {string} [text]
 * @returns {HTMLElement}
 */
function h(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** A labelled value in the header; `data-field` is what tests and the browser test read. */
function stat(parent, field, label) {
  const box = h("div", "nbm-stat");
  const value = h("span", "nbm-stat-value", DASH);
  value.dataset.field = field;
  box.append(h("span", "nbm-stat-label", label), value);
  parent.append(box);
  return value;
}

/** Hide or show a header stat (its labelled box). @param {HTMLElement} value @param {boolean} on */
function show(value, on) {
  if (value.parentElement) value.parentElement.hidden = !on;
}

/** @param {number | null | undefined} fraction in [0, 1] */
function bar(fraction, level) {
  const outer = h("div", "nbm-bar");
  const inner = h("div", `nbm-bar-fill${level ? ` nbm-${level}` : ""}`);
  inner.style.width = `${isNum(fraction) ? Math.round(Math.min(1, Math.max(0, fraction)) * 1000) / 10 : 0}%`;
  outer.append(inner);
  return outer;
}

function level(fraction) {
  if (!isNum(fraction)) return "";
  return fraction >= 0.95 ? "crit" : fraction >= 0.85 ? "warn" : "";
}

/** One gauge row: label, bar, text. */
function gauge(label, fraction, text, field) {
  const row = h("div", "nbm-gauge");
  const value = h("span", "nbm-gauge-text", text);
  if (field) value.dataset.field = field;
  row.append(h("span", "nbm-gauge-label", label), bar(fraction, level(fraction)), value);
  return row;
}

function card(title, kind) {
  const box = h("div", `nbm-card nbm-card-${kind}`);
  box.append(h("div", "nbm-card-title", title));
  return box;
}

const ratio = (a, b) => (isNum(a) && isNum(b) && b > 0 ? a / b : null);

/** @param {Record<string, any>} system */
export function systemCards(system) {
  const cards = [];
  const cpu = card("CPU", "cpu");
  // The gauge is the share of the whole machine (all cores); the process's figure is of one
  // core, as top shows it, so a process on several cores exceeds 100%.
  const machine = gauge("machine", isNum(system.cpu_percent) ? system.cpu_percent / 100 : null, fmtPercent(system.cpu_percent), "cpu");
  machine.title = "CPU use of the whole machine, all cores together";
  cpu.append(machine);
  if (isNum(system.process_cpu_percent)) {
    const note = h("div", "nbm-note", `this process ${fmtPercent(system.process_cpu_percent)} of one core`);
    note.dataset.field = "process_cpu";
    note.title = "100% is one core busy; a process using several cores shows more";
    cpu.append(note);
  }
  cards.push(cpu);
  const ram = card("RAM", "ram");
  ram.append(
    gauge(
      "used",
      ratio(system.ram_used_bytes, system.ram_total_bytes),
      `${fmtBytes(system.ram_used_bytes)} / ${fmtBytes(system.ram_total_bytes)}`,
      "ram",
    ),
  );
  if (isNum(system.process_rss_bytes)) ram.append(h("div", "nbm-note", `this process ${fmtBytes(system.process_rss_bytes)}`));
  cards.push(ram);
  if (isNum(system.energy_per_step_j) || isNum(system.energy_per_sample_j)) {
    const energy = card("Energy", "energy");
    const e1 = h("div", "nbm-note", `${fmtJoules(system.energy_per_step_j)} / step`);
    e1.dataset.field = "energy_per_step";
    const e2 = h("div", "nbm-note", `${fmtJoules(system.energy_per_sample_j)} / sample`);
    e2.dataset.field = "energy_per_sample";
    energy.append(e1, e2);
    cards.push(energy);
  }
  return cards;
}

/** @param {Record<string, any>} d @param {number} index */
export function deviceCard(d, index) {
  const box = card(`GPU ${index}${d.name ? ` \u00b7 ${d.name}` : ""}`, "gpu");
  box.dataset.device = String(index);
  const memFrac = ratio(d.mem_used_bytes, d.mem_total_bytes);
  box.append(
    gauge("util", isNum(d.util_percent) ? d.util_percent / 100 : null, fmtPercent(d.util_percent)),
    gauge("memory", memFrac, `${fmtBytes(d.mem_used_bytes)} / ${fmtBytes(d.mem_total_bytes)}`),
  );
  const temp = isNum(d.temperature_c) ? `${Math.round(d.temperature_c)} \u00b0C` : DASH;
  const power = isNum(d.power_w)
    ? `${Math.round(d.power_w)} W${isNum(d.power_limit_w) ? ` / ${Math.round(d.power_limit_w)} W` : ""}`
    : DASH;
  box.append(h("div", "nbm-note", `${temp} \u00b7 ${power}`));
  const throttle = typeof d.throttle === "string" ? d.throttle.trim() : "";
  if (throttle && throttle.toLowerCase() !== "none") {
    const t = h("div", "nbm-throttle", `throttled: ${throttle}`);
    box.append(t);
  }
  return box;
}

const MAX_LAYER_NAMES = 4;
// The strip shows the newest few alerts; older ones stay in mon.events() and the run log.
export const MAX_ALERTS_SHOWN = 3;

// Evidence shown when an alert is opened: its first entries, each value cut short.
const MAX_EVIDENCE = 12;
const MAX_EVIDENCE_ITEMS = 8;

/** An alert's identity in the run: its rule and step (what a cause's `explains` names). */
export function alertKey(alert) {
  return `${alert?.rule ?? ""}@${alert?.step ?? ""}`;
}

/** One evidence value as text: numbers formatted, lists and objects cut short. */
export function evidenceText(value, depth = 0) {
  if (value === null || value === undefined) return DASH;
  if (typeof value === "number") return fmtNumber(value);
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value === "string") return value;
  if (depth > 2) return "\u2026";
  if (Array.isArray(value)) {
    const shown = value.slice(0, MAX_EVIDENCE_ITEMS).map((v) => evidenceText(v, depth + 1));
    const more = value.length > MAX_EVIDENCE_ITEMS ? ` +${value.length - MAX_EVIDENCE_ITEMS} more` : "";
    return `${shown.join(", ")}${more}`;
  }
  if (typeof value === "object") {
    const entries = Object.entries(value).slice(0, MAX_EVIDENCE_ITEMS);
    return entries.map(([k, v]) => `${k.replaceAll("_", " ")} ${evidenceText(v, depth + 1)}`).join("; ");
  }
  return String(value);
}

/** Whether an alert has more to show when opened than its one line. */
function hasDetail(alert) {
  const evidence = alert.evidence;
  return Boolean(
    alert.cause || alert.fix || alert.place || (Array.isArray(alert.explains) && alert.explains.length) ||
      (evidence && typeof evidence === "object" && Object.keys(evidence).length),
  );
}

/** The opened alert: its cause (or that it is a symptom), place, evidence, what it explains, fix. */
export function alertDetail(alert) {
  const box = h("div", "nbm-alert-detail");
  const row = (label, text, cls = "") => {
    const line = h("div", `nbm-alert-row ${cls}`.trim());
    line.append(h("span", "nbm-alert-label", label), h("span", "nbm-alert-value", text));
    box.append(line);
  };
  if (alert.cause) row("cause", String(alert.cause), "nbm-alert-cause");
  else row("symptom", "no cause found that explains it", "nbm-alert-symptom");
  if (alert.place) row("where", String(alert.place));
  const evidence = alert.evidence && typeof alert.evidence === "object" ? alert.evidence : {};
  const entries = Object.entries(evidence).filter(([k]) => k !== "symptoms");
  if (entries.length) {
    const list = h("dl", "nbm-evidence");
    for (const [key, value] of entries.slice(0, MAX_EVIDENCE)) {
      list.append(h("dt", "", key.replaceAll("_", " ")), h("dd", "", evidenceText(value)));
    }
    box.append(list);
  }
  const explains = Array.isArray(alert.explains) ? alert.explains : [];
  if (explains.length) {
    row("explains", explains.map((e) => (Array.isArray(e) ? `${e[0]} (step ${fmtInt(e[1])})` : String(e))).join(", "));
  }
  if (alert.fix) row("fix", String(alert.fix), "nbm-alert-fix");
  return box;
}

/**
 * One alert of the strip. One with a cause, evidence or fix opens on a click (a `<details>`),
 * and stays open across redraws while `open` holds its key.
 * @param {Record<string, any>} alert
 * @param {Set<string>} [open]
 */
export function alertItem(alert, open) {
  const item = h("li", `nbm-alert nbm-sev-${alert.severity ?? "warning"}`);
  const message = String(alert.message ?? alert.rule ?? "");
  // Most diagnoses already name their step; add it only where the message does not.
  const step = isNum(alert.step) && !/\bstep\b/.test(message) ? ` (step ${fmtInt(alert.step)})` : "";
  const line = [h("span", "nbm-alert-msg", `${message}${step}`)];
  const layers = Array.isArray(alert.layers) ? alert.layers : [];
  if (layers.length) {
    const more = layers.length > MAX_LAYER_NAMES ? ` +${layers.length - MAX_LAYER_NAMES} more` : "";
    const names = h("span", "nbm-alert-layers", `in ${layers.slice(0, MAX_LAYER_NAMES).join(", ")}${more}`);
    names.title = layers.join("\n");
    line.push(names);
  }
  if (!hasDetail(alert)) {
    item.append(...line);
    return item;
  }
  const details = /** @type {HTMLDetailsElement} */ (h("details", "nbm-alert-open"));
  const summary = h("summary", "nbm-alert-summary");
  summary.append(...line);
  details.append(summary, alertDetail(alert));
  const key = alertKey(alert);
  details.open = Boolean(open?.has(key));
  details.addEventListener("toggle", () => {
    if (!open) return;
    if (details.open) open.add(key);
    else open.delete(key);
  });
  item.append(details);
  return item;
}

/** The alerts the strip lists: those no later cause took in (a cause shows its symptoms). */
export function standing(alerts) {
  const taken = new Set();
  for (const alert of alerts) {
    for (const e of Array.isArray(alert.explains) ? alert.explains : []) {
      if (Array.isArray(e)) taken.add(`${e[0]}@${e[1]}`);
    }
  }
  return alerts.filter((a) => !taken.has(alertKey(a)));
}

let views = 0;

class Dashboard {
  /** @param {HTMLElement} el @param {(msg: Record<string, any>) => void} [send] */
  constructor(el, send) {
    this.el = el;
    this.root = h("div", "nbm-root");
    el.append(this.root);
    views += 1;
    // Hovering one chart shows the same step on every chart of this view.
    this.sync = `nbm-${views}-${Math.random().toString(36).slice(2, 8)}`;

    const header = h("div", "nbm-header");
    const title = h("div", "nbm-title");
    this.run = h("span", "nbm-run");
    this.backend = h("span", "nbm-chip nbm-backend");
    this.status = h("span", "nbm-status");
    this.status.dataset.field = "status";
    // The CUDA allocator's settings in force (PYTORCH_CUDA_ALLOC_CONF): they change what fits.
    this.allocator = h("span", "nbm-chip nbm-allocator");
    this.allocator.dataset.field = "allocator";
    this.allocator.title = "the CUDA caching allocator's settings in force";
    // Is the fine-tune training: the adapters' verdict, on a model with adapters only.
    this.adapters = h("span", "nbm-chip nbm-adapters");
    this.adapters.dataset.field = "adapters";
    title.append(this.run, this.backend, this.allocator, this.adapters, this.status);
    const stats = h("div", "nbm-stats");
    this.step = stat(stats, "step", "step");
    this.progress = h("div", "nbm-progress");
    this.step.parentElement?.append(this.progress);
    this.loss = stat(stats, "loss", "loss");
    this.best = stat(stats, "best_loss", "best loss");
    this.throughput = stat(stats, "samples_per_s", "samples/s");
    this.tokens = stat(stats, "tokens_per_s", "tokens/s");
    this.tflops = stat(stats, "tflops_per_s", "TFLOP/s");
    this.mfu = stat(stats, "mfu_percent", "MFU");
    this.stepTime = stat(stats, "step_time", "step time");
    this.memory = stat(stats, "memory_peak", "memory peak");
    this.batchFits = stat(stats, "batch_fits", "batch fits");
    this.elapsed = stat(stats, "elapsed", "elapsed");
    this.eta = stat(stats, "eta", "ETA");
    header.append(title, stats);
    // A live run's controls (pause, stop, checkpoint, lr): hidden on replays.
    this.steer = new SteerBar(send ?? (() => {}));
    header.append(this.steer.root);

    this.gauges = h("div", "nbm-gauges");
    this.alerts = h("ul", "nbm-alerts");
    this.openAlerts = new Set(); // the alerts opened, by alertKey: kept across redraws
    this.tabs = h("div", "nbm-tabs");
    this.tabs.setAttribute("role", "tablist");
    this.body = h("div", "nbm-panels");
    this.root.append(header, this.gauges, this.alerts, this.tabs, this.body);
    /** @type {Map<string, {tab: HTMLButtonElement, box: HTMLElement, panel: {update: (s: any) => boolean, destroy: () => void}, has: boolean}>} */
    this.panels = new Map();
    this.active = "";
    this.chosen = false; // the user picked a tab: keep it
  }

  /** @param {string[]} names the panels of this view, in tab order */
  setPanels(names) {
    for (const name of names ?? []) {
      if (this.panels.has(name)) continue;
      const module = panelNamed(name);
      if (!module) continue; // a newer kernel-side panel than this front end: skip it
      const tab = /** @type {HTMLButtonElement} */ (h("button", "nbm-tab", module.title));
      tab.type = "button";
      tab.dataset.tab = name;
      tab.setAttribute("role", "tab");
      tab.hidden = true;
      tab.addEventListener("click", () => {
        this.chosen = true;
        this.select(name);
      });
      const box = h("div", "nbm-panel");
      box.dataset.panel = name;
      box.hidden = true;
      this.tabs.append(tab);
      this.body.append(box);
      this.panels.set(name, { tab, box, panel: module.create(box, { sync: this.sync }), has: false });
    }
  }

  /** @param {string} name */
  select(name) {
    this.active = name;
    for (const [key, p] of this.panels) {
      const on = key === name;
      p.box.hidden = !on;
      p.tab.classList.toggle("nbm-tab-active", on);
      p.tab.setAttribute("aria-selected", String(on));
    }
  }

  /** @param {string} name @param {any} state */
  drawPanel(name, state) {
    const p = this.panels.get(name);
    if (!p) return;
    p.has = Boolean(state) && p.panel.update(state);
    p.tab.hidden = !p.has;
    const shown = [...this.panels.values()].filter((q) => q.has).length;
    // One panel alone needs no tab bar.
    this.tabs.hidden = shown < 2;
    // Until the user picks a tab, the first panel (in tab order) that has data is shown.
    const current = this.panels.get(this.active);
    if (!this.chosen || !current || !current.has) {
      const first = [...this.panels.entries()].find(([, q]) => q.has);
      if (first && first[0] !== this.active) this.select(first[0]);
    }
  }
  /** @param {Record<string, any>} s */
  drawHeader(s) {
    this.run.textContent = s.run ?? "";
    this.backend.textContent = s.backend ?? "";
    const status = s.status ?? "running";
    this.status.textContent = status;
    this.status.className = `nbm-status nbm-status-${status}`;
    const total = isNum(s.total_steps) ? s.total_steps : null;
    this.step.textContent = total ? `${fmtInt(s.step)} / ${fmtInt(total)}` : fmtInt(s.step);
    this.progress.hidden = !total;
    this.progress.replaceChildren(bar(total && isNum(s.step) ? s.step / total : null, ""));
    this.loss.textContent = fmtNumber(s.loss);
    this.best.textContent = fmtNumber(s.best_loss);
    this.throughput.textContent = fmtNumber(s.samples_per_s, 3);
    // Token ids in the inputs: tokens/s replaces samples/s; FLOPs counted: TFLOP/s and MFU.
    const tokens = isNum(s.tokens_per_s);
    this.tokens.textContent = fmtNumber(s.tokens_per_s, 3);
    show(this.tokens, tokens);
    show(this.throughput, !tokens);
    const flops = isNum(s.tflops_per_s);
    this.tflops.textContent = fmtNumber(s.tflops_per_s, 3);
    this.mfu.textContent = isNum(s.mfu_percent) ? fmtPercent(s.mfu_percent) : DASH;
    this.mfu.title = isNum(s.mfu_percent) ? "achieved FLOP/s over the device's peak" : (s.mfu_note ?? "");
    show(this.tflops, flops);
    show(this.mfu, flops);
    this.stepTime.textContent = fmtStepTime(s.step_time);
    this.drawMemory(s);
    this.elapsed.textContent = fmtDuration(s.elapsed_s);
    this.eta.textContent = status === "closed" || status === "stopped" ? DASH : fmtDuration(s.eta_s);
  }

  /** The last steps' memory peak against the device's limit, and the batch estimated to fit. */
  drawMemory(s) {
    const known = isNum(s.memory_peak_bytes) && isNum(s.memory_limit_bytes) && s.memory_limit_bytes > 0;
    this.memory.textContent = known ? `${fmtBytes(s.memory_peak_bytes)} / ${fmtBytes(s.memory_limit_bytes)}` : DASH;
    this.memory.title = known ? "the last steps' peak against the device's limit" : "";
    show(this.memory, known);
    const fits = isNum(s.batch_fits);
    // "over N": more than N fit, beyond the range the linear estimate is said for.
    const more = s.batch_fits_more === 1;
    this.batchFits.textContent = fits ? `${more ? "over " : "~"}${fmtInt(Math.round(s.batch_fits))}` : DASH;
    this.batchFits.title = isNum(s.batch_size)
      ? `the largest batch estimated to fit (now ${fmtInt(Math.round(s.batch_size))}): activations grow with the batch, parameters and optimizer state do not` +
        (more ? "; more than this fit, but the estimate is not said beyond 16 times the batch" : "")
      : "";
    show(this.batchFits, fits);
    const allocator = typeof s.allocator === "string" ? s.allocator : "";
    this.allocator.textContent = allocator;
    this.allocator.hidden = allocator === "";
    this.drawAdapters(s);
  }

  /** The adapters' verdict: its head on the chip ("adapters learning"), the whole line on hover. */
  drawAdapters(s) {
    const text = typeof s.adapters === "string" ? s.adapters : "";
    const head = text.split(":")[0];
    this.adapters.textContent = head;
    this.adapters.title = text;
    this.adapters.hidden = text === "";
    // "adapters": waiting for the first updates; "receiving gradients": updates not measured.
    const fine = ["adapters learning", "adapters", "adapters receiving gradients"].includes(head);
    this.adapters.classList.toggle("nbm-adapters-bad", text !== "" && !fine);
  }

  drawGauges(system, devices) {
    const cards = systemCards(system ?? {});
    (devices ?? []).forEach((d, i) => cards.push(deviceCard(d, i)));
    this.gauges.replaceChildren(...cards);
  }

  drawAlerts(alerts, errors) {
    const all = standing(alerts ?? []);
    const items = all
      .slice(-MAX_ALERTS_SHOWN)
      .reverse()
      .map((a) => alertItem(a, this.openAlerts));
    if (all.length > MAX_ALERTS_SHOWN) {
      const more = all.length - MAX_ALERTS_SHOWN;
      items.push(h("li", "nbm-alert nbm-more", `+${more} earlier alert${more > 1 ? "s" : ""} (mon.events())`));
    }
    for (const error of errors ?? []) items.push(h("li", "nbm-alert nbm-sev-error nbm-error", String(error)));
    this.alerts.replaceChildren(...items);
    this.alerts.hidden = items.length === 0;
  }

  destroy() {
    for (const p of this.panels.values()) p.panel.destroy();
    this.panels.clear();
    this.root.remove();
  }
}

/**
 * Draw the model in `el`; returns the cleanup anywidget calls when the view goes away.
 * @param {{ model: any, el: HTMLElement }} ctx
 */
function render({ model, el }) {
  const view = new Dashboard(el, (msg) => model.send(msg));
  const dirty = new Set(["header", "gauges", "alerts", "tabs", "steer"]);
  let frame = 0;

  const redraw = () => {
    frame = 0;
    if (dirty.has("tabs")) {
      view.setPanels(model.get("panels") ?? []);
      for (const name of view.panels.keys()) dirty.add(panelTrait(name));
    }
    if (dirty.has("header")) view.drawHeader(model.get("header") ?? {});
    if (dirty.has("steer")) view.steer.draw(model.get("steer") ?? {});
    if (dirty.has("gauges")) view.drawGauges(model.get("system"), model.get("devices"));
    if (dirty.has("alerts")) view.drawAlerts(model.get("alerts"), model.get("errors"));
    for (const name of view.panels.keys()) {
      if (dirty.has(panelTrait(name))) view.drawPanel(name, model.get(panelTrait(name)));
    }
    dirty.clear();
  };

  const schedule = (/** @type {string} */ section) => {
    dirty.add(section);
    if (!frame) frame = requestAnimationFrame(redraw);
  };
  /** @type {[string, () => void][]} */
  const listeners = Object.entries(SECTIONS).map(([trait, sections]) => [
    `change:${trait}`,
    () => {
      for (const s of sections) schedule(s);
    },
  ]);
  // Every panel the front end knows; a view listens whether or not it shows the panel yet.
  for (const { name } of PANELS) {
    listeners.push([`change:${panelTrait(name)}`, () => schedule(panelTrait(name))]);
  }
  for (const [event, fn] of listeners) model.on(event, fn);
  redraw();

  return () => {
    for (const [event, fn] of listeners) model.off(event, fn);
    if (frame) cancelAnimationFrame(frame);
    frame = 0;
    view.destroy();
  };
}

export default { render };
