// The live events feed (/api/v1/events, a WebSocket on the same origin): one connection for
// the whole console, reconnected with back-off after it closes (a gateway restart), never
// polled. Subscribers: feed.on(type, callback) -> unsubscribe.
//   types: node, circuit, settings, notification, request, stats, model, queue (SPEC §9.3, §18);
//   "refresh": the hello data on every (re)connect, null after a resync (re-read by GET);
//   "state": "open" or "closed".

const BACKOFF_MS = [250, 500, 1000, 2000, 4000];

class Feed {
  constructor() {
    this.handlers = new Map();
    this.socket = null;
    this.state = "closed";
    this.hello = null;
    this.failures = 0;
    this.timer = null;
  }

  on(type, callback) {
    if (!this.handlers.has(type)) this.handlers.set(type, new Set());
    this.handlers.get(type).add(callback);
    return () => this.handlers.get(type)?.delete(callback);
  }

  emit(type, data) {
    for (const callback of [...(this.handlers.get(type) ?? [])]) {
      try {
        callback(data);
      } catch (err) {
        console.error(`a ${type} subscriber failed`, err);
      }
    }
  }

  start() {
    if (this.socket || this.timer) return;
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${location.host}/api/v1/events`);
    this.socket = socket;
    socket.addEventListener("message", (event) => this.receive(event.data));
    socket.addEventListener("close", () => this.closed(socket));
  }

  receive(text) {
    let frame;
    try {
      frame = JSON.parse(text);
    } catch {
      return;
    }
    if (frame.type === "hello") {
      this.failures = 0;
      this.hello = frame.data;
      this.setState("open");
      this.emit("refresh", frame.data);
    } else if (frame.type === "resync") {
      this.emit("refresh", null);
    } else {
      this.emit(frame.type, frame.data);
    }
  }

  closed(socket) {
    if (this.socket !== socket) return;
    this.socket = null;
    this.setState("closed");
    const wait = BACKOFF_MS[Math.min(this.failures, BACKOFF_MS.length - 1)];
    this.failures += 1;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.start();
    }, wait);
  }

  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.emit("state", state);
  }
}

export const feed = new Feed();
