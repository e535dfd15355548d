// The widget of nbmonitor.devices() (anywidget ESM, its own bundle): the devices panel of the
// registry (./panels/devices.js), fed the one trait `state`. Only the default export renders
// (anywidget's current form).

import panel from "./panels/devices.js";

export { bytes, fixed, sparkline } from "./panels/devices.js";

/** @param {{ model: any, el: HTMLElement }} ctx */
function render({ model, el }) {
  const view = panel.create(el);
  const draw = () => view.update(model.get("state"));
  model.on("change:state", draw);
  draw();
  return () => {
    model.off("change:state", draw);
    view.destroy();
  };
}

export default { render };
