// The devices panel of nbmonitor.devices(): one card per GPU with bars and sparklines graded
// against the alert thresholds, its clocks, throttle reasons, links and processes; the machine's
// and this kernel's CPU, RAM, disk and network; the device alerts. A panel of the registry
// (./index.js: {name, title, create}), and the whole of the devices widget (../devices.js
// renders it from the one trait `state`, nbmonitor/ui/devices.py). Nothing is kept between
// refreshes but the DOM.

const CSS = `
.nbm-dev { font: 12px/1.4 var(--jp-ui-font-family, system-ui, sans-serif);
  color: var(--jp-ui-font-color1, #222); }
.nbm-dev-head { display: flex; gap: 12px; align-items: baseline; margin-bottom: 6px; }
.nbm-dev-title { font-weight: 600; font-size: 13px; }
.nbm-dev-muted { color: var(--jp-ui-font-color2, #666); }
.nbm-dev-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(280px, 1fr));
  gap: 8px; }
.nbm-dev-card { border: 1px solid var(--jp-border-color2, #ddd); border-radius: 4px;
  padding: 6px 8px; }
.nbm-dev-card h4 { margin: 0 0 4px; font-size: 12px; font-weight: 600; }
.nbm-dev-row { display: grid; grid-template-columns: 58px 1fr 132px; gap: 6px;
  align-items: center; }
.nbm-dev-bar { height: 8px; background: var(--jp-layout-color2, #eee); border-radius: 2px;
  overflow: hidden; }
.nbm-dev-bar > div { height: 100%; background: #3b82f6; }
.nbm-dev-spark { width: 100%; height: 18px; display: block; }
.nbm-dev-spark polyline { fill: none; stroke: #3b82f6; stroke-width: 1.2; }
.nbm-grade-warn { color: #b45309; } .nbm-grade-warn .nbm-dev-bar > div { background: #d97706; }
.nbm-grade-alert { color: #b91c1c; font-weight: 600; }
.nbm-grade-alert .nbm-dev-bar > div { background: #dc2626; }
.nbm-dev-procs { width: 100%; border-collapse: collapse; margin-top: 4px; }
.nbm-dev-procs td { padding: 0 4px 0 0; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; max-width: 140px; }
.nbm-dev-alert { margin: 2px 0; }
.nbm-dev-alert.warning { color: #b45309; } .nbm-dev-alert.error { color: #b91c1c; }
`;

/** @param {string} tag @param {string} [className] @param {string} [text] */
function h(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** @param {number | null | undefined} v */
const finite = (v) => typeof v === "number" && Number.isFinite(v);

/** @param {number | null | undefined} v */
export function bytes(v) {
  if (!finite(v)) return "-";
  let x = /** @type {number} */ (v);
  for (const unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
    if (Math.abs(x) < 1024 || unit === "TiB") return unit === "B" ? `${x.toFixed(0)} B` : `${x.toFixed(1)} ${unit}`;
    x /= 1024;
  }
  return "-";
}

/** @param {number | null | undefined} v @param {string} unit @param {number} [digits] */
export function fixed(v, unit, digits = 0) {
  return finite(v) ? `${/** @type {number} */ (v).toFixed(digits)}${unit}` : "-";
}

/** An SVG polyline of the finite values, scaled to [lo, hi] (default: their range).
 * @param {(number | null)[]} values @param {number} [lo] @param {number} [hi] */
export function sparkline(values, lo, hi) {
  // Parsed from markup: the HTML parser puts <svg> in the SVG namespace, so the bundle names no
  // URL (the dashboard's bundle is checked for none).
  const box = document.createElement("div");
  box.innerHTML = '<svg class="nbm-dev-spark" viewBox="0 0 100 18" preserveAspectRatio="none"></svg>';
  const svg = /** @type {SVGSVGElement} */ (box.firstElementChild);
  const pts = values.map((v, i) => [i, v]).filter(([, v]) => finite(v));
  if (pts.length < 2) return svg;
  const ys = pts.map(([, v]) => /** @type {number} */ (v));
  const min = lo ?? Math.min(...ys);
  const max = hi ?? Math.max(...ys);
  const span = max - min || 1;
  const n = Math.max(values.length - 1, 1);
  const points = pts
    .map(([i, v]) => `${((/** @type {number} */ (i) / n) * 100).toFixed(2)},${(17 - ((/** @type {number} */ (v) - min) / span) * 16).toFixed(2)}`)
    .join(" ");
  box.innerHTML = `<svg class="nbm-dev-spark" viewBox="0 0 100 18" preserveAspectRatio="none"><polyline points="${points}"></polyline></svg>`;
  return /** @type {SVGSVGElement} */ (box.firstElementChild);
}

/** @param {string} label @param {number | null} fraction @param {string} text
 * @param {(number | null)[] | undefined} spark @param {string} grade @param {number} [lo] @param {number} [hi] */
function meter(label, fraction, text, spark, grade, lo, hi) {
  const row = h("div", `nbm-dev-row nbm-grade-${grade}`);
  const middle = h("div");
  const bar = h("div", "nbm-dev-bar");
  const fill = h("div");
  fill.style.width = `${Math.max(0, Math.min(1, fraction ?? 0)) * 100}%`;
  bar.append(fill);
  middle.append(bar);
  if (spark) middle.append(sparkline(spark, lo, hi));
  row.append(h("span", "nbm-dev-muted", label), middle, h("span", "", text));
  return row;
}

/** @param {any} gpu */
function gpuCard(gpu) {
  const v = gpu.values ?? {};
  const g = gpu.grades ?? {};
  const card = h("div", "nbm-dev-card");
  card.dataset.gpu = String(gpu.index);
  card.append(h("h4", "", `GPU ${gpu.index} · ${gpu.name}`));
  card.append(meter("util", finite(v.util_percent) ? v.util_percent / 100 : null, fixed(v.util_percent, " %"), gpu.spark?.util_percent, "ok", 0, 100));
  const memFrac = finite(v.mem_used_bytes) && finite(v.mem_total_bytes) && v.mem_total_bytes > 0 ? v.mem_used_bytes / v.mem_total_bytes : null;
  card.append(meter("memory", memFrac, `${bytes(v.mem_used_bytes)} / ${bytes(v.mem_total_bytes)}`, gpu.spark?.mem_used_bytes, g.mem_used_bytes ?? "ok", 0, v.mem_total_bytes ?? undefined));
  card.append(meter("temp", finite(v.temperature_c) ? v.temperature_c / 100 : null, fixed(v.temperature_c, " °C"), gpu.spark?.temperature_c, g.temperature_c ?? "ok"));
  const powerFrac = finite(v.power_w) && finite(v.power_limit_w) && v.power_limit_w > 0 ? v.power_w / v.power_limit_w : null;
  card.append(meter("power", powerFrac, `${fixed(v.power_w, " W")} / ${fixed(v.power_limit_w, " W")}`, gpu.spark?.power_w, "ok", 0, v.power_limit_w ?? undefined));
  const link = finite(v.pcie_gen) ? `PCIe gen${v.pcie_gen} x${fixed(v.pcie_width, "")}` : "PCIe -";
  const nvlink = finite(v.nvlink_links) && v.nvlink_links > 0 ? ` · NVLink ${v.nvlink_links} links` : "";
  card.append(h("div", "nbm-dev-muted", `SM ${fixed(v.sm_clock_mhz, " MHz")} · mem ${fixed(v.mem_clock_mhz, " MHz")} · fan ${fixed(v.fan_percent, " %")} · ${link}${nvlink}`));
  const throttle = h("div", `nbm-dev-throttle nbm-grade-${g.throttle ?? "ok"}`, `clocks: ${gpu.throttle || "not held down"}`);
  card.append(throttle);
  const procs = gpu.processes ?? [];
  if (procs.length) {
    const table = h("table", "nbm-dev-procs");
    for (const p of procs) {
      const tr = h("tr");
      tr.append(h("td", "", p.name), h("td", "nbm-dev-muted", String(p.pid)), h("td", "", bytes(p.used_bytes)));
      table.append(tr);
    }
    card.append(table);
  } else {
    card.append(h("div", "nbm-dev-muted", "no processes"));
  }
  return card;
}

/** @param {any} state */
function machineCard(state) {
  const m = state.machine ?? {};
  const s = state.spark ?? {};
  const card = h("div", "nbm-dev-card nbm-dev-machine");
  card.append(h("h4", "", `Machine · ${state.host ?? ""}`));
  card.append(meter("CPU", finite(m.cpu_percent) ? m.cpu_percent / 100 : null, fixed(m.cpu_percent, " %"), s.cpu_percent, "ok", 0, 100));
  const ramFrac = finite(m.ram_used_bytes) && finite(m.ram_total_bytes) && m.ram_total_bytes > 0 ? m.ram_used_bytes / m.ram_total_bytes : null;
  card.append(meter("RAM", ramFrac, `${bytes(m.ram_used_bytes)} / ${bytes(m.ram_total_bytes)}`, s.ram_used_bytes, "ok", 0, m.ram_total_bytes ?? undefined));
  card.append(h("div", "nbm-dev-muted", `disk read ${bytes(m.disk_read_bytes_per_s)}/s · write ${bytes(m.disk_write_bytes_per_s)}/s`));
  card.append(h("div", "nbm-dev-muted", `net in ${bytes(m.net_recv_bytes_per_s)}/s · out ${bytes(m.net_sent_bytes_per_s)}/s`));
  const kernel = h("div", "nbm-dev-card nbm-dev-kernel");
  kernel.append(h("h4", "", "This kernel"));
  kernel.append(meter("CPU", finite(m.process_cpu_percent) ? m.process_cpu_percent / 100 : null, fixed(m.process_cpu_percent, " %"), s.process_cpu_percent, "ok", 0));
  kernel.append(meter("RSS", ramFrac === null ? null : (m.process_rss_bytes ?? 0) / (m.ram_total_bytes || 1), bytes(m.process_rss_bytes), s.process_rss_bytes, "ok", 0));
  kernel.append(h("div", "nbm-dev-muted", `read ${bytes(m.process_read_bytes_per_s)}/s · write ${bytes(m.process_write_bytes_per_s)}/s`));
  return [card, kernel];
}

/** The panel in `el`: update(state) redraws it (true: it has something to show).
 * @param {HTMLElement} el */
export function create(el) {
  const root = h("div", "nbm-dev");
  const style = h("style");
  style.textContent = CSS;
  const head = h("div", "nbm-dev-head");
  const grid = h("div", "nbm-dev-grid");
  const alerts = h("div", "nbm-dev-alerts");
  const notes = h("div", "nbm-dev-muted nbm-dev-notes");
  root.append(style, head, grid, alerts, notes);
  el.append(root);

  /** @param {any} given */
  const update = (given) => {
    const state = given ?? {};
    const gpus = state.gpus ?? [];
    head.replaceChildren(
      h("span", "nbm-dev-title", "Devices"),
      h("span", "nbm-dev-muted nbm-dev-status", `${state.status ?? "starting"} · every ${state.interval ?? "?"} s · ${gpus.length} GPU${gpus.length === 1 ? "" : "s"}${state.run_dir ? ` · recording to ${state.run_dir}` : ""}`),
      h("span", "nbm-dev-muted nbm-dev-elapsed", `${fixed(state.elapsed_s, " s")}`),
    );
    grid.replaceChildren(...gpus.map(gpuCard), ...machineCard(state));
    alerts.replaceChildren(...(state.alerts ?? []).map((/** @type {any} */ a) => h("div", `nbm-dev-alert ${a.severity}`, `⚠ ${a.message}`)));
    notes.replaceChildren(...[...(state.notes ?? []), ...(state.errors ?? [])].map((/** @type {string} */ n) => h("div", "", n)));
    return Boolean(state.machine);
  };
  return { update, destroy: () => root.remove() };
}

export default { name: "devices", title: "Devices", create };
