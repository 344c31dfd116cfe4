// A horizontal meter (role="meter"): how much of a whole is used, and optionally a second
// part that is being taken (drawn lighter after the first), e.g. memory in use and memory a
// load under way reserves, against a budget. Named by the element `labelledBy` names; its
// value is read out as `text`.
//
// meter({ labelledBy }) -> element with .set({ value, pending = 0, max, text })

import { el } from "./field.js";

const percent = (part, whole) => (whole > 0 ? Math.max(0, Math.min(100, (part / whole) * 100)) : 0);

export function meter({ labelledBy }) {
  const used = el("span", { class: "meter-used" });
  const pending = el("span", { class: "meter-pending" });
  const bar = el("div", {
    class: "meter", role: "meter", "aria-labelledby": labelledBy,
    "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": "0",
  }, used, pending);
  bar.set = ({ value, pending: coming = 0, max, text }) => {
    const now = percent(value, max);
    const next = percent(coming, max);
    // CSSOM, not a style attribute: the console's CSP allows no inline styles.
    used.style.width = `${now}%`;
    pending.style.width = `${Math.min(next, 100 - now)}%`;
    bar.classList.toggle("over", max > 0 && value + coming > max);
    bar.setAttribute("aria-valuenow", String(Math.round(now)));
    bar.setAttribute("aria-valuetext", text);
  };
  return bar;
}
