// Models > Distributed pool: a banner (with a button that turns it on) while load balancing
// is off, the load-balancing section, the models and the computers holding them, the
// endpoints and the routing stats with each circuit's state.

import { el } from "../components/field.js";
import { circuitBadge, lbSection, statusBadge } from "../lb-section.js";
import { poolState } from "../pool-state.js";

const ms = (value) => (value === null || value === undefined ? "–" : `${Math.round(value)} ms`);
// The share of prompt tokens an upstream's cache served (SPEC §15 cacheHitRate).
const percent = (rate) => (rate === null || rate === undefined ? "–" : `${Math.round(rate * 100)}%`);

function table(caption, headers, rows, empty) {
  if (!rows.length) return el("p", { class: "muted", text: empty });
  return el("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption },
            el("table", { class: "table" },
               el("caption", { class: "sr-only", text: caption }),
               el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { scope: "col", text: h })))),
               el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((cell, i) =>
                 i === 0 ? el("th", { scope: "row" }, cell) : el("td", {}, cell)))))));
}

function names(data) {
  return new Map((data.nodes ?? []).map((n) => [n.fingerprint, n.name]));
}

function banner(app, state) {
  const button = el("button", { type: "button", class: "primary", disabled: app.readOnly,
                                text: "Turn load balancing on" });
  const status = el("span", { class: "form-status", role: "status" });
  button.addEventListener("click", async () => {
    button.disabled = true;
    status.textContent = "Saving…";
    try {
      const stale = state.mark("lb");
      const lb = await app.api.put("/api/v1/settings/load-balancing", { enabled: true });
      if (!stale()) state.set("lb", lb); // else the feed's settings are as new or newer
      status.textContent = "";
    } catch (err) {
      status.className = "form-status bad";
      status.textContent = err.message;
    } finally {
      button.disabled = app.readOnly;
    }
  });
  return el("div", { class: "notice warn banner", role: "region", "aria-label": "Load balancing is off" },
            el("p", { text: "Load balancing is off: requests for models this computer does not " +
                            "have are not sent to the other computers, and they are not checked." }),
            el("div", { class: "row" }, button, status));
}

export function mount(root, app) {
  const state = poolState(app);
  const off = banner(app, state);
  off.hidden = true;
  const section = lbSection(app, state);
  const models = el("section", { class: "card", "aria-labelledby": "pool-models" },
                    el("h2", { id: "pool-models", text: "Models" }));
  const endpoints = el("section", { class: "card", "aria-labelledby": "pool-endpoints" },
                       el("h2", { id: "pool-endpoints", text: "Endpoints" }));
  const stats = el("section", { class: "card", "aria-labelledby": "pool-stats" },
                   el("h2", { id: "pool-stats", text: "Routing stats" }));
  const summary = el("p", { class: "muted summary" });
  root.append(el("h1", { text: "Distributed pool" }), off, summary, section, models, endpoints, stats);

  const keep = (node, ...content) => node.replaceChildren(node.firstChild, ...content);
  const draw = (data) => {
    if (data.lb) off.hidden = data.lb.enabled;
    section.update(data);
    const who = names(data);
    const label = (fp) => who.get(fp) ?? fp;
    const pool = data.pool;
    if (pool) {
      summary.textContent = `${pool.onlineNodes} of ${pool.totalNodes} computers online` +
        (pool.enabled ? ` · strategy ${pool.strategy}` : " · load balancing off");
      keep(models, table("Models in the pool", ["Model", "Held by"],
        pool.models.map((m) => [m.id, m.availableOn.map(label).join(", ")]),
        pool.enabled ? "No other computer offers a model yet." : "Turn load balancing on to see the other computers' models."));
      keep(endpoints, table("Endpoints", ["Computer", "Status", "Latency", "Loaded models", "Priority", "Last error"],
        pool.endpoints.map((e) => [
          el("span", {}, el("span", { text: label(e.fingerprint) }), el("br"),
             el("span", { class: "muted mono small", text: e.baseUrl })),
          statusBadge(e.status), ms(e.latencyMs), String(e.loadedModelCount), String(e.priority),
          e.lastError ?? "–"]),
        "No computer is connected: add one on the Nodes screen."));
    }
    const st = data.stats;
    if (st) {
      const rows = st.nodes.map((n) => [label(n.fingerprint), String(n.totalRequests), String(n.successCount),
        String(n.failureCount), String(n.abortedCount), ms(n.avgLatencyMs), String(n.activeRequests),
        percent(n.cacheHitRate), circuitBadge(n.circuitState), String(n.consecutiveFailures)]);
      if (st.local) {
        rows.push(["This computer (local)", String(st.local.totalRequests), String(st.local.successCount),
          String(st.local.failureCount), "–", ms(st.local.avgLatencyMs), String(st.local.activeRequests),
          percent(st.local.cacheHitRate), "–", "–"]);
      }
      const totals = el("p", { class: "muted", text:
        `${st.totalRequests} requests · ${st.totalSuccesses} succeeded · ${st.totalFailures} failed` +
        (st.failovers !== undefined ? ` · ${st.failovers} failovers` : "") +
        (st.circuitBreaker ? ` · a circuit opens after ${st.circuitBreaker.failureThreshold} failures in a row and retries after ${st.circuitBreaker.resetTimeoutSecs} s` : "") });
      keep(stats, totals, table("Routing stats", ["Computer", "Requests", "Succeeded", "Failed", "Aborted",
        "Average", "In flight", "Prompt cache hits", "Circuit", "Failures in a row"], rows, "Nothing routed yet."));
    }
  };
  const unsubscribe = state.onChange(draw);
  draw(state.data);
  return () => {
    unsubscribe();
    state.close();
  };
}
