#!/usr/bin/env node
// A fast, deterministic OpenAI-style model server for the benchmark (node standard library
// only). It listens on 127.0.0.1:<port> (model "bench-tcp") and on a Unix socket (model
// "bench-unix") and prints one line "ready" once both listen.
//
//   node bench/mock_upstream.js --port 39500 --unix /tmp/slb-x/mock.sock
//
// POST /v1/chat/completions reads the JSON body:
//   "stream": true  -> text/event-stream, `bench_chunks` (default 100) chat.completion.chunk
//                      events, one HTTP chunk (res.write) each, `bench_gap_ms` (default 0)
//                      apart, then "data: [DONE]\n\n".
//   otherwise       -> a ~600-byte chat.completion JSON with Content-Length.
// Other fields are ignored, "stream_options" too: a stream's usage is always in its last
// chunk (the one with finish_reason "stop"), so the request the gateway sends for an
// Ollama chat (S11: "stream_options": {"include_usage": true}) gets S3's stream.
// Every body is a pure function of (model, bench_chunks), so sha256 of a body can be compared
// between a direct connection and a proxy.
'use strict';

const http = require('http');
const fs = require('fs');

function parseArgs(argv) {
  const out = { port: null, unix: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--port') out.port = Number(argv[++i]);
    else if (a === '--unix') out.unix = argv[++i];
    else throw new Error(`unknown argument: ${a}`);
  }
  if (!Number.isInteger(out.port) || out.port <= 0 || out.port > 65535 || !out.unix) {
    throw new Error('usage: mock_upstream.js --port PORT --unix SOCKET_PATH');
  }
  return out;
}

const MAX_CHUNKS = 100000;
const MAX_GAP_MS = 60000;
const ANSWER = 'Hello! This is a deterministic answer from the sluice benchmark mock. '
  + 'It is long enough to look like a short chat reply: about three hundred bytes of '
  + 'plain text, the same every time, so that every proxy can be checked byte for byte '
  + 'against a direct connection. Nothing here varies between requests or runs.';

// Per-model caches of the bodies we send: built once, reused (no per-request JSON work).
function makeModel(model) {
  const listBody = Buffer.from(JSON.stringify({
    object: 'list',
    data: [{ id: model, object: 'model', created: 0, owned_by: 'mock' }],
  }));
  const completion = Buffer.from(JSON.stringify({
    choices: [{
      finish_reason: 'stop',
      index: 0,
      message: { role: 'assistant', content: ANSWER },
    }],
    created: 0,
    model,
    system_fingerprint: 'b0',
    object: 'chat.completion',
    usage: { completion_tokens: 64, prompt_tokens: 24, total_tokens: 88 },
    id: 'chatcmpl-bench',
  }));
  const events = [];   // events[i] for a stream of n chunks: i < n-1 content, n-1 the stop
  const stops = new Map();
  return {
    model,
    listBody,
    completion,
    event(i) {
      while (events.length <= i) {
        const k = events.length;
        events.push(Buffer.from('data: ' + JSON.stringify({
          choices: [{ finish_reason: null, index: 0, delta: { content: `tok${k} ` } }],
          created: 0,
          id: 'chatcmpl-bench',
          model,
          system_fingerprint: 'b0',
          object: 'chat.completion.chunk',
        }) + '\n\n'));
      }
      return events[i];
    },
    stop(n) {
      let buf = stops.get(n);
      if (buf === undefined) {
        buf = Buffer.from('data: ' + JSON.stringify({
          choices: [{ finish_reason: 'stop', index: 0, delta: {} }],
          created: 0,
          id: 'chatcmpl-bench',
          model,
          system_fingerprint: 'b0',
          object: 'chat.completion.chunk',
          usage: { completion_tokens: n, prompt_tokens: 24, total_tokens: n + 24 },
        }) + '\n\n');
        if (stops.size < 1000) stops.set(n, buf);
      }
      return buf;
    },
  };
}

const DONE = Buffer.from('data: [DONE]\n\n');
const SSE_HEADERS = {
  'Content-Type': 'text/event-stream',
  'Cache-Control': 'no-cache',
  'X-Accel-Buffering': 'no',
};

function sendJson(res, status, body) {
  res.writeHead(status, {
    'Content-Type': 'application/json; charset=utf-8',
    'Content-Length': body.length,
  });
  res.end(body);
}

function sendError(res, status, message) {
  sendJson(res, status, Buffer.from(JSON.stringify({
    error: { message, type: 'invalid_request_error', code: null, param: null },
  })));
}

function intParam(value, dflt, max) {
  if (value === undefined || value === null) return dflt;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > max) return null;
  return n;
}

function stream(res, m, n, gapMs) {
  res.writeHead(200, SSE_HEADERS);
  let i = 0;
  let timer = null;
  let closed = false;
  res.on('close', () => {
    closed = true;
    if (timer !== null) clearTimeout(timer);
  });
  const eventAt = (k) => (k === n - 1 ? m.stop(n) : m.event(k));
  if (gapMs === 0) {
    for (; i < n; i++) res.write(eventAt(i));
    res.end(DONE);
    return;
  }
  const next = () => {
    timer = null;
    if (closed) return;
    if (i < n) {
      res.write(eventAt(i));
      i++;
      timer = setTimeout(next, gapMs);
    } else {
      res.end(DONE);
    }
  };
  next();
}

function handler(m) {
  return (req, res) => {
    const path = req.url.split('?', 1)[0];
    if (path === '/v1/models' || path === '/models') {
      if (req.method !== 'GET') return sendError(res, 405, 'method not allowed');
      req.resume();
      return sendJson(res, 200, m.listBody);
    }
    if (path !== '/v1/chat/completions') {
      req.resume();
      return sendError(res, 404, `no route for ${path}`);
    }
    if (req.method !== 'POST') {
      req.resume();
      return sendError(res, 405, 'method not allowed');
    }
    const parts = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size <= 1 << 20) parts.push(c);
    });
    req.on('end', () => {
      if (size > 1 << 20) return sendError(res, 413, 'body too large');
      let body;
      try {
        body = JSON.parse(parts.length === 1 ? parts[0] : Buffer.concat(parts));
      } catch (e) {
        return sendError(res, 400, 'body is not JSON');
      }
      if (body === null || typeof body !== 'object') return sendError(res, 400, 'not an object');
      if (body.stream === true) {
        const n = intParam(body.bench_chunks, 100, MAX_CHUNKS);
        const gap = intParam(body.bench_gap_ms, 0, MAX_GAP_MS);
        if (n === null || n < 1 || gap === null) {
          return sendError(res, 400, 'bad bench_chunks or bench_gap_ms');
        }
        return stream(res, m, n, gap);
      }
      return sendJson(res, 200, m.completion);
    });
  };
}

function makeServer(model) {
  const server = http.createServer({ noDelay: true, keepAlive: true }, handler(makeModel(model)));
  server.keepAliveTimeout = 60000;
  server.headersTimeout = 61000;
  server.requestTimeout = 0;
  server.maxRequestsPerSocket = 0;
  // server.maxConnections is left unset: no limit.
  server.on('connection', (sock) => sock.setNoDelay(true));
  server.on('clientError', (err, sock) => {
    if (sock.writable) sock.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n');
    else sock.destroy();
  });
  return server;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  try {
    fs.unlinkSync(args.unix);
  } catch (e) {
    if (e.code !== 'ENOENT') throw e;
  }
  const tcp = makeServer('bench-tcp');
  const unix = makeServer('bench-unix');
  let listening = 0;
  const onListen = () => {
    if (++listening === 2) process.stdout.write('ready\n');
  };
  const fail = (err) => {
    process.stderr.write(`mock_upstream: ${err.message}\n`);
    process.exit(1);
  };
  tcp.on('error', fail);
  unix.on('error', fail);
  tcp.listen({ port: args.port, host: '127.0.0.1', backlog: 4096 }, onListen);
  unix.listen({ path: args.unix, backlog: 4096 }, onListen);

  const quit = () => {
    try {
      fs.unlinkSync(args.unix);
    } catch (e) {
      // already gone
    }
    process.exit(0);
  };
  process.on('SIGTERM', quit);
  process.on('SIGINT', quit);
  // Our parent holds our stdin open: when it goes away (even killed), so do we.
  if (fs.fstatSync(0).isFIFO()) {
    process.stdin.on('end', quit);
    process.stdin.on('error', quit);
    process.stdin.resume();
  }
}

main();
