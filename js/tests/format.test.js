import { describe, expect, it } from "vitest";
import { DASH, fmtBytes, fmtDuration, fmtNumber, fmtStepTime } from "../src/format.js";

describe("formatting", () => {
  it("shows a dash for missing values", () => {
    expect(fmtNumber(null)).toBe(DASH);
    expect(fmtNumber(Number.NaN)).toBe(DASH);
    expect(fmtBytes(undefined)).toBe(DASH);
  });
  it("keeps numbers short", () => {
    expect(fmtNumber(0.123456)).toBe("0.1235");
    expect(fmtNumber(1234567)).toBe("1.23e+6");
    expect(fmtNumber(0.00001234)).toBe("1.23e-5");
    expect(fmtBytes(3 * 2 ** 30)).toBe("3.0 GiB");
  });
  it("formats durations and step times", () => {
    expect(fmtDuration(5.25)).toBe("5.3 s");
    expect(fmtDuration(125)).toBe("2:05");
    expect(fmtDuration(3725)).toBe("1:02:05");
    expect(fmtStepTime(0.0251)).toBe("25.1 ms");
  });
});

import { si, siBytes, siSeconds, tickLabels } from "../src/format.js";

describe("SI formatting for charts", () => {
  it("writes short numbers", () => {
    expect([si(18000), si(1.2e6), si(0.25), si(3e-4), si(0), si(-4500), si(1)]).toEqual(["18k", "1.2M", "0.25", "3e-4", "0", "-4.5k", "1"]);
    expect([siBytes(1.2 * 2 ** 30), siBytes(512)]).toEqual(["1.2 GiB", "512 B"]);
    expect([siSeconds(0.045), siSeconds(2e-5), siSeconds(3), siSeconds(600)]).toEqual(["45 ms", "20 \u00b5s", "3 s", "10 min"]);
  });

  it("gives neighbouring ticks distinct labels with as few digits as that needs", () => {
    expect(tickLabels([0.0099, 0.01, 0.0101], "")).toEqual(["9.9e-3", "1e-2", "1.01e-2"]);
    expect(tickLabels([0, 5000, 10000, 15000], "")).toEqual(["0", "5k", "10k", "15k"]);
    expect(tickLabels([10, 20], "%")).toEqual(["10%", "20%"]);
    // A tick uPlot filtered out (null) gets no label; the others keep one form.
    expect(tickLabels([1e-4, null, 0.01, null, 1], "")).toEqual(["1e-4", "", "1e-2", "", "1e0"]);
  });
});
