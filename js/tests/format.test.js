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
