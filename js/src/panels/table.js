// Sortable per-layer table. Sorting is front-end state: it survives data updates but is not
// synced back to Python (nothing there needs it).

import { DASH, fmtBytes, fmtInt, fmtNumber, isNum } from "../format.js";

export const COLUMNS = [
  { key: "name", label: "layer", kind: "text" },
  { key: "shape", label: "shape", kind: "text" },
  { key: "numel", label: "params", kind: "int" },
  { key: "dtype", label: "dtype", kind: "text" },
  { key: "grad_norm", label: "grad norm", kind: "num" },
  { key: "param_norm", label: "param norm", kind: "num" },
  { key: "update_ratio", label: "update/param", kind: "num" },
  { key: "flags", label: "flags", kind: "flags" },
];

/** @param {unknown} v */
function flagList(v) {
  if (Array.isArray(v)) return v.map(String);
  if (typeof v === "string" && v) return v.split(/[,\s]+/).filter(Boolean);
  return [];
}

/** @param {unknown} v */
const isMissing = (v) => v == null || (typeof v === "number" && Number.isNaN(v));

/** @param {unknown} a @param {unknown} b */
function compare(a, b) {
  const am = isMissing(a);
  const bm = isMissing(b);
  if (am || bm) return am === bm ? 0 : am ? 1 : -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

/**
 * @param {Record<string, unknown>[]} rows @param {string | null} key @param {number} dir
 * @returns {Record<string, unknown>[]}
 */
export function sortRows(rows, key, dir) {
  if (!key) return rows.slice();
  const sortKey = (/** @type {Record<string, unknown>} */ r) =>
    key === "flags" ? flagList(r.flags).length || null : key === "shape" ? String(r.shape ?? "") : r[key];
  return rows
    .map((row, index) => ({ row, index }))
    .sort((x, y) => {
      const a = sortKey(x.row);
      const b = sortKey(y.row);
      const c = compare(a, b);
      // Missing values sort last whatever the direction, so they never hide the interesting
      // rows; equal keys keep the engine's (model) order.
      const fixed = isMissing(a) || isMissing(b);
      return (fixed ? c : c * dir) || x.index - y.index;
    })
    .map((x) => x.row);
}

/** A sortable table; `columns` default to the per-layer ones ({key, label, kind} each). */
export class LayerTable {
  /** @param {HTMLElement} parent @param {{key: string, label: string, kind: string}[]} [columns] */
  constructor(parent, columns = COLUMNS) {
    this.columns = columns;
    this.table = document.createElement("table");
    this.table.className = "nbm-table";
    this.head = document.createElement("thead");
    this.body = document.createElement("tbody");
    this.table.append(this.head, this.body);
    parent.append(this.table);
    /** @type {string | null} */
    this.sortKey = null;
    this.sortDir = -1;
    /** @type {Record<string, unknown>[]} */
    this.rows = [];
    const tr = document.createElement("tr");
    for (const col of this.columns) {
      const th = document.createElement("th");
      th.textContent = col.label;
      th.dataset.key = col.key;
      th.className = `nbm-col-${col.kind}`;
      tr.append(th);
    }
    this.head.append(tr);
    this.onClick = (/** @type {MouseEvent} */ event) => {
      const th = /** @type {HTMLElement | null} */ (event.target)?.closest?.("th");
      if (!th?.dataset.key) return;
      if (this.sortKey === th.dataset.key) this.sortDir = -this.sortDir;
      else {
        this.sortKey = th.dataset.key;
        this.sortDir = th.classList.contains("nbm-col-text") ? 1 : -1;
      }
      this.render();
    };
    this.head.addEventListener("click", this.onClick);
  }

  /** @param {Record<string, unknown>[]} rows */
  update(rows) {
    this.rows = rows;
    this.render();
  }

  render() {
    for (const th of this.head.querySelectorAll("th")) {
      const key = /** @type {HTMLElement} */ (th).dataset.key;
      th.classList.toggle("nbm-sorted", key === this.sortKey);
      th.dataset.dir = key === this.sortKey ? (this.sortDir > 0 ? "asc" : "desc") : "";
    }
    const frag = document.createDocumentFragment();
    for (const row of sortRows(this.rows, this.sortKey, this.sortDir)) {
      const tr = document.createElement("tr");
      const flags = flagList(row.flags);
      if (flags.length) tr.className = "nbm-flagged";
      for (const col of this.columns) {
        const td = document.createElement("td");
        td.className = `nbm-col-${col.kind}`;
        const v = row[col.key];
        if (col.kind === "flags") {
          for (const flag of flags) {
            const chip = document.createElement("span");
            chip.className = "nbm-flag";
            chip.textContent = flag;
            td.append(chip);
          }
        } else if (col.kind === "int") td.textContent = fmtInt(v);
        else if (col.kind === "bytes") td.textContent = isNum(v) ? fmtBytes(v) : DASH;
        else if (col.kind === "num") td.textContent = isNum(v) ? fmtNumber(v, 3) : DASH;
        else td.textContent = Array.isArray(v) ? `(${v.join(", ")})` : v == null ? DASH : String(v);
        tr.append(td);
      }
      frag.append(tr);
    }
    this.body.replaceChildren(frag);
  }

  destroy() {
    this.head.removeEventListener("click", this.onClick);
    this.table.remove();
  }
}
