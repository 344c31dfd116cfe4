// The load-balancing section, the same on the Nodes and Distributed pool screens: the
// "Load balancing" switch beside its heading and, only while it is on, the strategy,
// failover, loaded first, the health-check interval and the computers in priority order
// (reordered by drag, keyboard or buttons; each with its routing switch, its weight and
// routing details).
//
// lbSection(app, state) -> element with .update(data); state is a pool-state.js store.

import { el, field, select, uid } from "./components/field.js";
import { orderedList } from "./components/ordered-list.js";
import { toggle } from "./components/switch.js";

export const STRATEGIES = [
  { value: "cache-aware", label: "Cache-aware: where the conversation is warm, then least busy" },
  { value: "priority", label: "Priority: the top computer first" },
  { value: "round-robin", label: "Round robin: each in turn" },
  { value: "least-loaded", label: "Least loaded: fewest requests in flight" },
  { value: "fastest", label: "Fastest: lowest health-check latency" },
  { value: "weighted", label: "Weighted: by each computer's weight" },
];

const CIRCUIT = { closed: "closed", open: "open", half_open: "half-open" };

export function statusBadge(status) {
  const level = { online: "ok", warming: "warn", offline: "bad" }[status] ?? "";
  return el("span", { class: `badge ${level}`, text: status ?? "unknown" });
}

export function circuitBadge(state) {
  const level = { closed: "ok", half_open: "warn", open: "bad" }[state] ?? "";
  return el("span", { class: `badge ${level}`, text: `circuit ${CIRCUIT[state] ?? state ?? "closed"}` });
}

// What the weight field sends: a whole number as a number; anything else as typed, so that
// the server's refusal (and not a guess of ours) is what the field shows.
function weightValue(text) {
  const trimmed = text.trim();
  const number = Number(trimmed);
  return trimmed !== "" && Number.isInteger(number) ? number : trimmed;
}

// A computer's weight (1..100): saved on Enter or when the field loses focus, like the
// health-check interval, with "Saved" or the server's error beside it.
function weightField(app, state, item) {
  const weight = field({
    label: `Weight for ${item.name}`,
    name: "weight",
    type: "number",
    value: String(item.weight ?? 1),
    help: "1 to 100: its share of the requests under the weighted strategy",
    disabled: app.readOnly,
    save: async (value) => {
      const node = await patchNode(app, state, item, { weight: weightValue(value) });
      return String(node?.weight ?? value);
    },
  });
  Object.assign(weight.input, { min: 1, max: 100, step: 1 });
  weight.input.setAttribute("inputmode", "numeric");
  weight.classList.add("weight-field");
  weight.rename = (name) => {
    weight.querySelector("label").textContent = `Weight for ${name}`;
  };
  return weight;
}

// PATCH a node (a registry write: its event is `nodes`); resolves to the node as shown now:
// the answer's, or the feed's when it brought the registry since the PATCH was sent.
async function patchNode(app, state, item, change) {
  const stale = state.mark("nodes");
  const node = await app.api.patch(`/api/v1/nodes/${encodeURIComponent(item.fingerprint)}`, change);
  return stale() ? state.data.nodes?.find((n) => n.fingerprint === item.fingerprint) : node;
}

const ms = (value) => (value === null || value === undefined ? "–" : `${Math.round(value)} ms`);

// The items of the order: each registry entry with its endpoint and its routing stats.
export function computers(data) {
  const endpoints = new Map((data.pool?.endpoints ?? []).map((e) => [e.fingerprint, e]));
  const stats = new Map((data.stats?.nodes ?? []).map((n) => [n.fingerprint, n]));
  return (data.nodes ?? []).map((node) => ({
    ...node,
    endpoint: endpoints.get(node.fingerprint) ?? null,
    stats: stats.get(node.fingerprint) ?? null,
  }));
}

function computerRow(app, state, item) {
  const title = el("strong", { class: "node-name" });
  const place = el("span", { class: "muted place" });
  const status = el("span", { class: "node-status" });
  const facts = el("dl", { class: "facts" });
  const routing = toggle({
    label: `Route requests to ${item.name}`,
    text: "Routing",
    checked: item.enabled,
    disabled: app.readOnly,
    save: async (enabled) => (await patchNode(app, state, item, { enabled }))?.enabled ?? enabled,
  });
  const weight = weightField(app, state, item);
  let shownWeight = item.weight;
  const body = el("div", { class: "node-row" },
                  el("div", { class: "row wrap" }, title, place, status, el("span", { class: "spacer" }),
                     el("span", { class: "row" }, routing)),
                  weight,
                  facts);
  body.update = (next, position, count) => {
    title.textContent = next.name;
    weight.rename(next.name);
    if (next.weight !== shownWeight) {  // a change from elsewhere; a refused value stays
      shownWeight = next.weight;
      weight.set(String(next.weight ?? 1));
    }
    place.textContent = `${position} of ${count}`;
    const ep = next.endpoint;
    const st = next.stats;
    status.replaceChildren(next.enabled ? statusBadge(ep?.status) : el("span", { class: "badge", text: "not routed" }),
                           " ", circuitBadge(st?.circuitState));
    const rows = [
      ["Latency", ms(ep?.latencyMs)],
      ["Requests", st ? String(st.totalRequests) : "0"],
      ["Succeeded", st ? String(st.successCount) : "0"],
      ["Failed", st ? String(st.failureCount) : "0"],
      ["Aborted", st ? String(st.abortedCount) : "0"],
      ["Average", ms(st?.avgLatencyMs)],
      ["In flight", st ? String(st.activeRequests) : "0"],
      ["Failures in a row", st ? String(st.consecutiveFailures) : "0"],
    ];
    facts.replaceChildren(...rows.flatMap(([name, value]) =>
      [el("div", {}, el("dt", { text: name }), el("dd", { text: value }))]));
    if (ep?.lastError) facts.append(el("div", { class: "wide" }, el("dt", { text: "Last error" }), el("dd", { text: ep.lastError })));
    routing.set(next.enabled);
  };
  return body;
}

export function lbSection(app, state) {
  const headingId = uid("lb-heading");
  // The answer is drawn unless the feed brought newer settings since it was sent; a control
  // gets back the value shown now.
  const putLb = async (body) => {
    const stale = state.mark("lb");
    const lb = await app.api.put("/api/v1/settings/load-balancing", body);
    if (!stale()) state.set("lb", lb);
    return state.data.lb;
  };
  const lb = state.data.lb ?? {};
  const onOff = toggle({
    label: "Load balancing",
    checked: lb.enabled,
    disabled: app.readOnly,
    save: async (enabled) => (await putLb({ enabled })).enabled,
  });
  const strategy = select({
    label: "Strategy",
    name: "strategy",
    options: STRATEGIES,
    value: lb.strategy ?? "priority",
    disabled: app.readOnly,
    save: async (value) => (await putLb({ strategy: value })).strategy,
  });
  const failover = toggle({
    label: "Failover",
    text: "Failover: retry once on the next computer",
    checked: lb.failoverEnabled,
    disabled: app.readOnly,
    save: async (failoverEnabled) => (await putLb({ failoverEnabled })).failoverEnabled,
  });
  const preferLoaded = toggle({
    label: "Prefer computers that have the model loaded",
    text: "Prefer computers that have the model loaded",
    checked: lb.preferLoaded,
    disabled: app.readOnly,
    save: async (preferLoaded) => (await putLb({ preferLoaded })).preferLoaded,
  });
  const interval = field({
    label: "Health-check interval",
    name: "healthCheckInterval",
    value: lb.healthCheckInterval ?? "",
    help: "How often each computer is checked, e.g. 5s or 1m. Saved when you leave the field or press Enter.",
    disabled: app.readOnly,
    save: async (value) => (await putLb({ healthCheckInterval: value.trim() })).healthCheckInterval,
  });
  const order = orderedList({
    label: "Computers in priority order",
    items: computers(state.data),
    key: (item) => item.fingerprint,
    name: (item) => item.name,
    render: (item) => computerRow(app, state, item),
    readOnly: app.readOnly,
    save: async (fingerprints) => {
      const stale = state.mark("nodes"); // a node-registry write publishes `nodes`
      const nodes = await app.api.put("/api/v1/nodes/order", { order: fingerprints });
      if (!stale()) state.data.nodes = nodes;
      return computers(state.data); // the order shown now: the answer's or the feed's newer one
    },
  });
  const body = el("div", { class: "lb-body stack" },
                  el("div", { class: "grid2" }, strategy, interval),
                  el("div", { class: "row" }, failover),
                  el("div", { class: "row" }, preferLoaded),
                  el("h3", { text: "Computers in priority order" }),
                  order);
  const section = el("section", { class: "card lb-section", "aria-labelledby": headingId },
                     el("div", { class: "row heading-row" },
                        el("h2", { id: headingId, text: "Load balancing" }), onOff),
                     body);
  section.update = (data) => {
    const settings = data.lb;
    if (settings) {
      onOff.set(settings.enabled);
      strategy.set(settings.strategy);
      failover.set(settings.failoverEnabled);
      preferLoaded.set(settings.preferLoaded);
      interval.set(settings.healthCheckInterval);
    }
    body.hidden = !settings?.enabled;
    order.update(computers(data));
  };
  section.update(state.data);
  return section;
}
