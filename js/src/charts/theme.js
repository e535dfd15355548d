// Colours for canvas drawing, read from the host's theme: the CSS of .nbm-root maps JupyterLab's,
// VS Code's and marimo's variables (and prefers-color-scheme) onto --nbm-* properties, and a
// canvas needs them resolved to colours.

/** @param {Element} el */
export function themeOf(el) {
  const style = typeof getComputedStyle === "function" ? getComputedStyle(el) : null;
  const read = (/** @type {string} */ name, /** @type {string} */ fallback) =>
    (style?.getPropertyValue(name) ?? "").trim() || fallback;
  return {
    fg: read("--nbm-fg", "#1f2328"),
    muted: read("--nbm-muted", "#656d76"),
    grid: read("--nbm-grid", "rgba(128,128,128,0.18)"),
    font: `11px ${read("--nbm-font", "system-ui, sans-serif")}`,
  };
}

// Line colours that read on light and dark backgrounds.
export const COLORS = {
  blue: "#4c8ed9",
  lightBlue: "rgba(76,142,217,0.35)",
  orange: "#f28e2b",
  lightOrange: "rgba(242,142,43,0.35)",
  green: "#3ba55c",
  red: "#e15759",
  purple: "#9467bd",
  grey: "#8c8c8c",
  brown: "#b07a52",
  pink: "#e377c2",
  teal: "#17becf",
};
