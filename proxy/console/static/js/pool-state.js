// What the Nodes and Distributed pool screens show, in one place per screen: the
// load-balancing settings, the node registry, the pool's status and the routing stats; read
// with GET on mount and on every feed refresh, then kept current by the live events. The
// live feed is authoritative (screens/common.js feedOrder): a save's answer, or a GET's,
// that comes after a newer `loadBalancing` or `nodes` event is not drawn over it.
//
// poolState(app) -> { data, onChange(callback) -> unsubscribe, reload(), close(), set(part, value),
//                     mark(part) -> stale() }
//   data: { lb, nodes, pool, stats } (each null until read)
//   mark("lb" | "nodes") when a save of that part is sent; stale() when its answer comes says
//   the feed brought that part since (data[part] is then as new or newer: keep it).

import { feedOrder } from "./screens/common.js";

const PARTS = {
  lb: "/api/v1/settings/load-balancing",
  nodes: "/api/v1/nodes",
  pool: "/api/v1/pool/distributed-status",
  stats: "/api/v1/pool/routing-stats",
};

export function poolState(app) {
  const data = { lb: null, nodes: null, pool: null, stats: null };
  const listeners = new Set();
  let closed = false;
  let reading = 0;
  const fed = { lb: feedOrder(), nodes: feedOrder() }; // the feed's events of each part
  const mark = (part) => {
    const at = fed[part].mark();
    return () => fed[part].since(at);
  };

  const changed = () => {
    if (closed) return;
    for (const callback of [...listeners]) callback(data);
  };
  const set = (part, value) => {
    data[part] = value;
    changed();
  };

  async function reload() {
    const mine = ++reading;
    const entries = Object.entries(PARTS);
    const stale = Object.fromEntries(Object.keys(fed).map((part) => [part, mark(part)]));
    const results = await Promise.allSettled(entries.map(([, path]) => app.api.get(path)));
    if (mine !== reading || closed) return;
    results.forEach((result, i) => {
      const part = entries[i][0];
      if (result.status === "fulfilled" && !stale[part]?.()) data[part] = result.value;
    });
    const failed = results.find((r) => r.status === "rejected");
    if (failed && app.feed.state === "open") app.notify(`Could not read the pool: ${failed.reason.message}`, "error");
    changed();
  }

  function onNode(entry) {
    if (!data.pool) return;
    const endpoints = data.pool.endpoints;
    const at = endpoints.findIndex((e) => e.fingerprint === entry.fingerprint);
    if (at >= 0) endpoints[at] = entry;
    else endpoints.push(entry);
    data.pool.onlineNodes = endpoints.filter((e) => e.status === "online").length;
    changed();
    // The entry only counts a node's models; which models it holds is in the pool's body.
    app.api.get(PARTS.pool).then((pool) => set("pool", pool), () => {});
  }

  function onCircuit(event) {
    const node = data.stats?.nodes.find((n) => n.fingerprint === event.fingerprint);
    if (!node) return;
    node.circuitState = event.state;
    node.circuitOpen = event.state === "open";
    node.consecutiveFailures = event.consecutiveFailures;
    changed();
  }

  function onSettings(event) {
    if (event.section !== "loadBalancing" && event.section !== "nodes") return;
    const part = event.section === "nodes" ? "nodes" : "lb";
    fed[part].heard();
    set(part, event.value);
    // Which nodes the pool lists (and whether they are paused) follows these settings.
    app.api.get(PARTS.pool).then((pool) => set("pool", pool), () => {});
  }

  const unsubscribe = [
    app.feed.on("refresh", () => reload()),
    app.feed.on("node", onNode),
    app.feed.on("circuit", onCircuit),
    app.feed.on("settings", onSettings),
    app.feed.on("stats", (stats) => set("stats", stats)),
  ];
  reload();

  return {
    data,
    set,
    mark,
    reload,
    onChange(callback) {
      listeners.add(callback);
      return () => listeners.delete(callback);
    },
    close() {
      closed = true;
      for (const off of unsubscribe) off();
      listeners.clear();
    },
  };
}
