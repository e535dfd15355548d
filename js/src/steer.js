// The steering bar of a live run's dashboard: pause/resume, stop (asks to confirm first),
// checkpoint and a learning-rate input. A click sends one custom widget message,
// {type: "steer", kind, value}; the kernel queues it and the training thread applies it at the
// next step boundary (nbmonitor/ui/steer_controls.py). The bar says what the run is doing from
// the `steer` trait ({enabled, state, step}); between a click and the run's answer it says
// what was asked ("pausing…").

import { fmtInt, isNum } from "./format.js";

export const STEER_KINDS = ["pause", "resume", "stop", "checkpoint", "lr"];

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

/** @param {string} text @param {string} action @param {string} title */
function button(text, action, title) {
  const b = /** @type {HTMLButtonElement} */ (h("button", "nbm-steer-btn", text));
  b.type = "button";
  b.dataset.steer = action;
  b.title = title;
  return b;
}

/**
 * What the bar says: the run's state, or the request waiting for it.
 * @param {Record<string, any>} s the `steer` trait @param {string} pending
 */
export function steerText(s, pending) {
  const state = s?.state ?? "";
  const step = isNum(s?.step) ? ` at step ${fmtInt(s.step)}` : "";
  if (state === "stopped") return `stopped${step}`;
  if (state === "stopping") return "stopping after this step\u2026";
  if (state === "paused") return pending === "resume" ? "resuming\u2026" : `paused${step}`;
  if (pending === "pause") return "pausing after this step\u2026";
  if (pending === "checkpoint") return "checkpoint after this step\u2026";
  if (pending === "lr") return "learning rate set after this step\u2026";
  return "";
}

/** A learning rate typed by the user: a finite positive number, else null. @param {string} text */
export function parseLr(text) {
  const v = Number(String(text ?? "").trim());
  return Number.isFinite(v) && v > 0 && String(text).trim() !== "" ? v : null;
}

export class SteerBar {
  /** @param {(msg: Record<string, any>) => void} send */
  constructor(send) {
    this.send = send;
    this.root = h("div", "nbm-steer");
    this.root.hidden = true;
    this.pending = "";
    /** @type {number | undefined} the step shown when the pending request was sent */
    this.askedAt = undefined;
    /** @type {Record<string, any>} */
    this.state = {};
    this.pause = button("pause", "pause", "pause the training loop at the next step boundary");
    this.resume = button("resume", "resume", "resume the training loop");
    this.stop = button("stop", "stop", "stop the training loop at the next step boundary (asks first)");
    this.checkpoint = button("checkpoint", "checkpoint", "save the model and optimizer at the next step boundary");
    this.confirm = h("span", "nbm-steer-confirm");
    this.confirm.hidden = true;
    const yes = button("stop now", "confirm-stop", "stop after this step: the loop ends, the run closes as stopped");
    yes.classList.add("nbm-steer-danger");
    const no = button("cancel", "cancel-stop", "keep training");
    this.confirm.append(h("span", "nbm-steer-ask", "stop training after this step?"), yes, no);
    this.lr = /** @type {HTMLInputElement} */ (h("input", "nbm-steer-lr"));
    this.lr.type = "text";
    this.lr.placeholder = "lr";
    this.lr.size = 8;
    this.lr.dataset.field = "lr-input";
    this.lr.title = "new learning rate for every param group, from the next step";
    this.setLr = button("set lr", "lr", "set the learning rate at the next step boundary");
    this.text = h("span", "nbm-steer-state");
    this.text.dataset.field = "steer";
    this.controls = h("span", "nbm-steer-controls");
    this.controls.append(this.pause, this.resume, this.stop, this.confirm, this.checkpoint, this.lr, this.setLr);
    this.root.append(this.controls, this.text);

    this.pause.addEventListener("click", () => this.request("pause"));
    this.resume.addEventListener("click", () => this.request("resume"));
    this.checkpoint.addEventListener("click", () => this.request("checkpoint"));
    this.stop.addEventListener("click", () => this.ask(true));
    no.addEventListener("click", () => this.ask(false));
    yes.addEventListener("click", () => {
      this.ask(false);
      this.request("stop");
    });
    const sendLr = () => {
      const value = parseLr(this.lr.value);
      this.lr.classList.toggle("nbm-steer-bad", value === null);
      if (value !== null) this.request("lr", value);
    };
    this.setLr.addEventListener("click", sendLr);
    this.lr.addEventListener("keydown", (e) => {
      if (e.key === "Enter") sendLr();
    });
  }

  /** @param {boolean} on show the stop confirmation instead of the stop button */
  ask(on) {
    this.confirm.hidden = !on;
    this.stop.hidden = on;
  }

  /** @param {string} kind @param {number} [value] */
  request(kind, value) {
    /** @type {Record<string, any>} */
    const msg = { type: "steer", kind };
    if (value !== undefined) msg.value = value;
    this.pending = kind;
    this.askedAt = this.state?.step;
    this.send(msg);
    this.draw(this.state);
  }

  /** @param {Record<string, any>} s the `steer` trait */
  draw(s) {
    const state = s?.state ?? "";
    if (state !== this.state?.state) {
      // The run answered: what was asked is done (or superseded).
      if (state === "paused" && this.pending === "pause") this.pending = "";
      if (state === "running" && this.pending === "resume") this.pending = "";
      if (state === "stopping" || state === "stopped") this.pending = "";
    }
    // A checkpoint or an lr is applied at the next boundary: done once a later step shows.
    const later = isNum(s?.step) && isNum(this.askedAt) && s.step > this.askedAt;
    if ((this.pending === "checkpoint" || this.pending === "lr") && later) this.pending = "";
    this.state = s ?? {};
    const enabled = Boolean(s?.enabled);
    this.root.hidden = !enabled && !state;
    this.controls.hidden = !enabled;
    const paused = state === "paused";
    const stopping = state === "stopping" || state === "stopped";
    this.pause.hidden = paused || stopping;
    this.resume.hidden = !paused || stopping;
    if (stopping) this.ask(false);
    this.stop.hidden = stopping || !this.confirm.hidden;
    this.checkpoint.hidden = stopping;
    this.lr.hidden = stopping;
    this.setLr.hidden = stopping;
    this.text.textContent = steerText(this.state, this.pending);
    this.root.dataset.state = state;
  }
}
