#!/usr/bin/env node
// The benchmark's load client (node standard library only): one measurement per run.
//
//   node bench/load.js '{"target": {"tcp": "127.0.0.1:39080"}, "model": "bench-tcp",
//                        "stream": false, "concurrency": 1, "count": 2000}'
//
// Arguments (one JSON object):
//   target        {"tcp": "HOST:PORT"} or {"unix": "/path/to.sock"}
//   model         the "model" sent in each request
//   stream        true: SSE streams (chunks/gap_ms ask the mock for that shape)
//   chunks        events per stream (default 100), gap_ms: pause between them (default 0)
//   concurrency   requests in flight at once (one keep-alive connection each)
//   count         stop after this many requests, or
//   duration_s    stop starting requests after this many seconds
//   time_limit_s  hard limit (default 60): whatever is still in flight then is aborted
//   ramp_ms       spread the workers' first requests evenly over this long (default 0: all
//                 at once), so thousands of connections do not all knock on a listen
//                 backlog in the same millisecond (a full Unix-socket backlog refuses)
// Prints one JSON line with the results (times in milliseconds); `served_by` counts the
// responses' x-sluice-served-by values (a gateway's local backend or network node).
//
//   node bench/load.js --serve
// reads one such JSON object a line from stdin, runs them one after the other (each with
// its own connections, closed at its end) and prints each one's line: the smoke run's one
// client for all its loads (bench/run.py), instead of a process a load.
'use strict';

const http = require('http');
const crypto = require('crypto');
const { performance } = require('perf_hooks');

function runLoad(args, done) {
  const stream = args.stream === true;
  const chunks = args.chunks ?? 100;
  const gapMs = args.gap_ms ?? 0;
  const concurrency = args.concurrency ?? 1;
  const count = args.count ?? null;
  const durationMs = args.duration_s != null ? args.duration_s * 1000 : null;
  const timeLimitMs = (args.time_limit_s ?? 60) * 1000;
  const rampMs = args.ramp_ms ?? 0;
  if (count === null && durationMs === null) throw new Error('give count or duration_s');
  if (!args.model || !args.target) throw new Error('give target and model');

  const agent = new http.Agent({
    keepAlive: true,
    keepAliveMsecs: 60000,
    maxSockets: concurrency,
    maxFreeSockets: concurrency,
    scheduling: 'fifo',
  });
  const base = { agent, method: 'POST', path: args.path || '/v1/chat/completions' };
  if (args.target.unix) {
    base.socketPath = args.target.unix;
  } else {
    const [host, port] = args.target.tcp.split(':');
    base.host = host;
    base.port = Number(port);
  }
  const payload = {
    model: args.model,
    messages: [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: 'Write a short greeting for the benchmark.' },
    ],
    max_tokens: stream ? chunks : 64,
  };
  if (stream) {
    payload.stream = true;
    payload.bench_chunks = chunks;
    payload.bench_gap_ms = gapMs;
  }
  const body = Buffer.from(JSON.stringify(payload));
  base.headers = { 'Content-Type': 'application/json', 'Content-Length': body.length, ...(args.headers ?? {}) };

  // Results.
  const latencies = [];   // send -> last byte
  const ttfbs = [];       // send -> first body byte
  const gaps = [];        // between successive body reads of one response
  const digests = new Map();
  const statuses = new Map();
  const servedBy = new Map(); // x-sluice-served-by of each response (gateways only)
  const errors = new Map();
  let started = 0;
  let completed = 0;      // status 200, whole body (and, for streams, every event and [DONE])
  let incomplete = 0;
  let missingStreams = 0; // streams that ended short of a chunk
  let missingChunks = 0;
  let chunksGot = 0;      // data events received before [DONE], over all streams
  const inFlight = new Set();
  let stopping = false;
  let aborted = 0;

  const t0 = performance.now();
  let lastEnd = t0;
  const cpu0 = process.cpuUsage();

  function bump(map, key) {
    map.set(key, (map.get(key) || 0) + 1);
  }

  function countEvents(buf, prevLast) {
    // Count "\n\n" in buf, including one split across the previous read (prevLast = its last
    // byte). Overlapping "\n\n\n" counts once per position, as an SSE parser would not; the
    // mock never sends that.
    let n = 0;
    let i = buf.indexOf(10);
    while (i !== -1) {
      if (i === 0 ? prevLast === 10 : buf[i - 1] === 10) n++;
      i = buf.indexOf(10, i + 1);
    }
    return n;
  }

  function one(done) {
    started++;
    const ts = performance.now();
    let tFirst = -1;
    let tPrev = 0;
    let last = -1;
    let nEvents = 0;
    let tail = null;
    let finished = false;
    const hash = crypto.createHash('sha256');
    const req = http.request(base);
    inFlight.add(req);
    const finish = (ok, why) => {
      if (finished) return;
      finished = true;
      inFlight.delete(req);
      const now = performance.now();
      if (ok) {
        completed++;
        latencies.push(now - ts);
        lastEnd = now;
      } else {
        incomplete++;
        if (why) bump(errors, why);
      }
      done();
    };
    req.on('error', (err) => finish(false, err.code || err.message));
    req.on('response', (res) => {
      bump(statuses, res.statusCode);
      const by = res.headers['x-sluice-served-by'];
      if (by !== undefined) bump(servedBy, by);
      res.on('data', (buf) => {
        const now = performance.now();
        if (tFirst < 0) tFirst = now;
        else if (stream) gaps.push(now - tPrev);
        tPrev = now;
        hash.update(buf);
        if (stream) {
          nEvents += countEvents(buf, last);
          last = buf[buf.length - 1];
          tail = buf;
        }
      });
      res.on('error', () => {});
      res.on('close', () => {
        let short = false;
        if (stream) {
          const end = tail !== null && tail.toString('latin1').endsWith('data: [DONE]\n\n');
          const got = nEvents - (end ? 1 : 0);
          chunksGot += got;
          if (got < chunks) {
            missingStreams++;
            missingChunks += chunks - got;
          }
          short = !end || got !== chunks;
        }
        if (!res.complete) return finish(false, 'response cut');
        bump(digests, hash.digest('hex'));
        if (tFirst >= 0) ttfbs.push(tFirst - ts);
        if (res.statusCode !== 200) return finish(false, `status ${res.statusCode}`);
        if (short) return finish(false, 'stream short');
        finish(true);
      });
    });
    req.end(body);
  }

  function pct(sorted, p) {
    if (sorted.length === 0) return null;
    const k = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
    return Math.round(sorted[k] * 1000) / 1000;
  }

  function summary(values) {
    if (values.length === 0) return null;
    const s = Float64Array.from(values).sort();
    let sum = 0;
    for (const v of s) sum += v;
    return {
      n: s.length,
      p50: pct(s, 50),
      p90: pct(s, 90),
      p99: pct(s, 99),
      max: pct(s, 100),
      mean: Math.round((sum / s.length) * 1000) / 1000,
    };
  }

  let reported = false;
  function report(timedOut) {
    if (reported) return;
    reported = true;
    const cpu = process.cpuUsage(cpu0);
    const elapsedS = Math.max(lastEnd - t0, 1e-6) / 1000;
    const out = {
      stream,
      chunks: stream ? chunks : null,
      gap_ms: stream ? gapMs : null,
      concurrency,
      count,
      duration_s: args.duration_s ?? null,
      started,
      completed,
      incomplete,
      aborted,
      timed_out: timedOut,
      elapsed_s: Math.round(elapsedS * 1e6) / 1e6,
      requests_per_s: Math.round((completed / elapsedS) * 10) / 10,
      chunks_received: chunksGot,
      chunks_per_s: Math.round((chunksGot / elapsedS) * 10) / 10,
      missing_streams: missingStreams,
      missing_chunks: missingChunks,
      latency_ms: summary(latencies),
      ttfb_ms: summary(ttfbs),
      gap_ms_stats: summary(gaps),
      statuses: Object.fromEntries(statuses),
      served_by: Object.fromEntries(servedBy),
      errors: Object.fromEntries(errors),
      digests: Object.fromEntries(digests),
      client_cpu_s: Math.round(((cpu.user + cpu.system) / 1e6) * 1e4) / 1e4,
    };
    agent.destroy(); // this load's connections end with it
    done(out);
  }

  const hardTimer = setTimeout(() => {
    stopping = true;
    for (const req of inFlight) {
      aborted++;
      req.destroy(new Error('time limit'));
    }
    report(true);
  }, timeLimitMs);

  let active = 0;
  function worker() {
    const more = () => {
      if (stopping) return false;
      if (count !== null && started >= count) return false;
      if (durationMs !== null && performance.now() - t0 >= durationMs) return false;
      return true;
    };
    const loop = () => {
      if (more()) {
        one(loop);
      } else if (--active === 0) {
        clearTimeout(hardTimer);
        report(false);
      }
    };
    active++;
    loop();
  }

  if (rampMs > 0 && concurrency > 1) {
    active = concurrency; // no worker may report before the last one has started
    for (let i = 0; i < concurrency; i++) {
      setTimeout(() => {
        active--;
        worker();
      }, (i * rampMs) / concurrency);
    }
  } else {
    for (let i = 0; i < concurrency; i++) worker();
  }
}

if (process.argv[2] === '--serve') {
  const queue = [];
  let busy = false;
  let pending = '';
  const next = () => {
    if (busy || queue.length === 0) return;
    busy = true;
    runLoad(JSON.parse(queue.shift()), (out) => {
      process.stdout.write(JSON.stringify(out) + '\n', () => {
        busy = false;
        next();
      });
    });
  };
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (text) => {
    pending += text;
    let i;
    while ((i = pending.indexOf('\n')) !== -1) {
      const line = pending.slice(0, i).trim();
      pending = pending.slice(i + 1);
      if (line) queue.push(line);
    }
    next();
  });
  process.stdin.on('end', () => {
    const wait = () => (busy || queue.length ? setTimeout(wait, 10) : process.exit(0));
    wait();
  });
} else {
  runLoad(JSON.parse(process.argv[2] || '{}'), (out) => {
    process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
  });
}
