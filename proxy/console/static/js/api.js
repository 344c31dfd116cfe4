// The console's client for the gateway's JSON API (same origin). The admin token, when the
// page has one, lives in sessionStorage only and is sent as a Bearer token on every call.

export const TOKEN_KEY = "sluice.adminToken";

export function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

// A non-2xx answer, read from the OpenAI-shaped body {"error": {message, code, param}}.
export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && typeof body === "object" && body.error) || {};
    super(error.message || `the gateway answered ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.code = error.code ?? null;
    this.param = error.param ?? null;
  }
}

function headers(hasBody) {
  const result = { Accept: "application/json" };
  const admin = token();
  if (admin) result.Authorization = `Bearer ${admin}`;
  if (hasBody) result["Content-Type"] = "application/json";
  return result;
}

async function parse(response) {
  const text = await response.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

async function send(method, path, body, signal) {
  const hasBody = body !== undefined;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(hasBody),
      body: hasBody ? JSON.stringify(body) : undefined,
      cache: "no-store",
      signal,
    });
  } catch (err) {
    if (err && err.name === "AbortError") throw err;
    throw new ApiError(0, { error: { message: "the gateway cannot be reached", code: "offline" } });
  }
  const doc = await parse(response);
  if (!response.ok) throw new ApiError(response.status, doc);
  return doc;
}

// Server-sent events of a POST (the playground): onEvent(parsed JSON, or the string "[DONE]",
// or the raw text when it is not JSON; then the response headers). Resolves with the
// response's Headers once the stream ended; rejects with ApiError on a non-2xx answer and
// with an ApiError of code "stream_error" when the stream carries an error event.
async function stream(path, body, onEvent, signal) {
  let response;
  try {
    response = await fetch(path, {
      method: "POST",
      headers: { ...headers(true), Accept: "text/event-stream" },
      body: JSON.stringify(body),
      cache: "no-store",
      signal,
    });
  } catch (err) {
    if (err && err.name === "AbortError") throw err;
    throw new ApiError(0, { error: { message: "the gateway cannot be reached", code: "offline" } });
  }
  if (!response.ok) throw new ApiError(response.status, await parse(response));
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const deliver = (block) => {
    const data = block
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).replace(/^ /, ""))
      .join("\n");
    if (!data) return;
    if (data === "[DONE]") {
      onEvent("[DONE]", response.headers);
      return;
    }
    let parsed = data;
    try {
      parsed = JSON.parse(data);
    } catch {
      /* not JSON: given as text */
    }
    if (parsed && typeof parsed === "object" && parsed.error) {
      throw new ApiError(response.status, { error: { code: "stream_error", ...parsed.error } });
    }
    onEvent(parsed, response.headers);
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      deliver(block);
    }
  }
  buffer += decoder.decode();
  if (buffer.trim()) deliver(buffer);
  return response.headers;
}

export const api = {
  get: (path, signal) => send("GET", path, undefined, signal),
  put: (path, body) => send("PUT", path, body ?? {}),
  post: (path, body) => send("POST", path, body ?? {}),
  patch: (path, body) => send("PATCH", path, body ?? {}),
  del: (path) => send("DELETE", path),
  stream,
};
