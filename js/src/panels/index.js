// The panel registry: every panel the widget can show, by the name of its trait (panel_<name>)
// and of its Python module (nbmonitor/ui/panels/<name>.py). A new panel is one module and one
// line here. A panel module's default export is {name, title, create(el, ctx)}, create returning
// {update(state) -> has content, destroy()}.

import devices from "./devices.js";
import layers from "./layers.js";
import memory from "./memory.js";
import ranks from "./ranks.js";
import system from "./system.js";
import timeline from "./timeline.js";
import training from "./training.js";

export const PANELS = [training, system, memory, layers, timeline, ranks, devices];

/** @param {string} name */
export function panelNamed(name) {
  return PANELS.find((p) => p.name === name);
}
