// Bundle the anywidget ESM and its CSS into ../nbmonitor/static (shipped in the wheel).
// Self-contained ESM: no CDN imports, so the dashboard renders offline.
import * as esbuild from "esbuild";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const outdir = path.join(here, "..", "nbmonitor", "static");
const watch = process.argv.includes("--watch");

const options = {
  // One output per entry point: widget.js, widget.css, profile.js (the profile table) and
  // devices.js (the panel of nbmonitor.devices()).
  entryPoints: [
    path.join(here, "src", "widget.js"),
    path.join(here, "src", "widget.css"),
    path.join(here, "src", "panels", "profile.js"),
    path.join(here, "src", "devices.js"),
  ],
  outdir,
  bundle: true,
  format: "esm",
  target: ["es2020"],
  minify: !watch,
  sourcemap: watch ? "inline" : false,
  logLevel: "info",
  entryNames: "[name]",
};

if (watch) {
  const ctx = await esbuild.context(options);
  await ctx.watch();
} else {
  await esbuild.build(options);
}
