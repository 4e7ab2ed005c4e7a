// Shared by every dashboard page: the API client, DOM building (text only, never HTML
// from data), formatting, links between pages and plotly defaults.

const TOKEN_KEY = "fleetbench.readToken";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
  }
}

/**
 * GET a JSON document from the registry; params with empty values are left out, a list's
 * values each given (reserve=a&reserve=b).
 */
export async function api(path, params = {}) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(params)) {
    for (const one of Array.isArray(value) ? value : [value]) {
      if (one !== undefined && one !== null && one !== "") url.searchParams.append(key, String(one));
    }
  }
  const headers = { Accept: "application/json" };
  const token = window.localStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(url, { headers });
  } catch (error) {
    throw new ApiError(0, `The registry did not answer (${error.message}).`);
  }
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    throw new ApiError(response.status, describeError(response, body));
  }
  if (body === null) {
    throw new ApiError(response.status, `${url.pathname} answered something that is not JSON.`);
  }
  return body;
}

function describeError(response, body) {
  if (response.status === 401) {
    return "This registry requires a token to read: a reader or admin token (FLEETBENCH_READ_TOKEN_REQUIRED).";
  }
  if (response.status === 403) {
    return "This token may not read here; reading requires a token of reader or admin scope.";
  }
  let detail = body && body.detail;
  if (Array.isArray(detail)) {
    detail = detail
      .map((d) => {
        const where = Array.isArray(d.loc) ? d.loc.filter((p) => p !== "query").join(".") : "";
        return where ? `${where}: ${d.msg}` : String(d.msg ?? JSON.stringify(d));
      })
      .join("; ");
  } else if (detail !== undefined && typeof detail !== "string") {
    detail = JSON.stringify(detail);
  }
  return `${response.status} ${response.statusText || "error"}${detail ? `: ${detail}` : ""}`;
}

/**
 * createElement with properties and children. Strings become text nodes, so data is never
 * parsed as HTML. props: class, dataset, on<event> handlers, anything else as an attribute.
 */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(props ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") element.className = value;
    else if (key === "dataset") Object.assign(element.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") {
      element.addEventListener(key.slice(2), value);
    } else element.setAttribute(key, value === true ? "" : String(value));
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(element, child);
    else if (child instanceof Node) element.appendChild(child);
    else element.appendChild(document.createTextNode(String(child)));
  }
}

/** Replace the contents of `target` with children. */
export function replace(target, ...children) {
  target.replaceChildren();
  append(target, children);
  return target;
}

/** A message in place of data: kind is "error", "empty" or "info". */
export function message(target, kind, text, { askToken = false } = {}) {
  const box = h("div", { class: `message ${kind}`, role: kind === "error" ? "alert" : "status" });
  box.appendChild(h("p", {}, text));
  if (askToken || (kind === "error" && text.includes("requires a token"))) box.appendChild(tokenForm());
  return replace(target, box);
}

/** Show an error (an ApiError or anything thrown) in `target`, and log unexpected ones. */
export function showError(target, error) {
  if (!(error instanceof ApiError)) console.error(error);
  return message(target, "error", error instanceof ApiError ? error.message : String(error));
}

function tokenForm() {
  const input = h("input", {
    type: "password",
    name: "token",
    placeholder: "reader or admin token",
  });
  return h(
    "form",
    {
      class: "inline-form",
      onsubmit: (event) => {
        event.preventDefault();
        window.localStorage.setItem(TOKEN_KEY, input.value.trim());
        window.location.reload();
      },
    },
    h("label", {}, "Token ", input),
    h("button", { type: "submit" }, "Use token"),
  );
}

// --- formatting ----------------------------------------------------------------------

export function fmt(value, digits = 2) {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  return Number(value).toLocaleString("en-US", {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  });
}

export function fmtPct(value, digits = 1) {
  if (value === null || value === undefined) return "—";
  return `${value > 0 ? "+" : value < 0 ? "−" : ""}${fmt(Math.abs(value), digits)} %`;
}

export function absoluteTime(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  return `${date.toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

function relativeTime(iso, now = Date.now()) {
  if (!iso) return "never";
  const seconds = (now - new Date(iso).getTime()) / 1000;
  if (Number.isNaN(seconds)) return String(iso);
  const future = seconds < 0;
  const s = Math.abs(seconds);
  const text =
    s < 90
      ? `${Math.round(s)} s`
      : s < 5400
        ? `${Math.round(s / 60)} min`
        : s < 129600
          ? `${Math.round(s / 3600)} h`
          : `${Math.round(s / 86400)} d`;
  return future ? `in ${text}` : `${text} ago`;
}

/** A <time> element: relative text, the absolute UTC time on hover. */
export function timeElement(iso) {
  if (!iso) return h("span", { class: "muted" }, "never");
  return h("time", { datetime: iso, title: absoluteTime(iso) }, relativeTime(iso));
}

export const METRICS = {
  s_tg: "decode tokens/s (S_TG)",
  s_pp: "prefill tokens/s (S_PP)",
  knee: "the curve's knee: the most streams worth running",
  outputs: "the model's outputs on the reference text: KL divergence from the run before, nats",
};

// --- links between pages -------------------------------------------------------------

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/** The node page (its models), or its curves of one model. */
export function curvesUrl(node, model) {
  return `/curves${query({ node, model })}`;
}

export function seriesUrl({ node, model, pp, tg, b, metric }) {
  return `/series${query({ node, model, pp, tg, b, metric })}`;
}

export function regressionsUrl(params = {}) {
  return `/regressions${query(params)}`;
}

export function placementUrl(params = {}) {
  return pageUrl("/placement", params);
}

/** A page of the dashboard with these query parameters (empty ones left out). */
export function pageUrl(path, params = {}) {
  return `${path}${query(params)}`;
}

/** The registry's model names as the suggestions of the form's #models list. */
export async function loadModelNames() {
  try {
    const models = await api("/v1/models");
    replace(
      document.getElementById("models"),
      (models.data ?? []).map((m) => h("option", { value: m.name })),
    );
  } catch {
    // Suggestions only: the form works without them.
  }
}

/** A muted dash where a value is missing. */
export function dash() {
  return h("span", { class: "muted" }, "—");
}

/** A badge styled by its kind ("no runs" -> class "no-runs"). */
export function badge(text, kind = text) {
  return h("span", { class: `badge ${String(kind).replaceAll(" ", "-")}` }, text);
}

/** A node's labels as key=value chips. */
export function labelChips(labels) {
  return Object.entries(labels ?? {}).map(([key, value]) => {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    return h("span", { class: "chip" }, `${key}=${text}`);
  });
}

/** The page's heading, subtitle and window title. */
export function setTitle(title, subtitle = "") {
  document.getElementById("title").textContent = title;
  document.getElementById("subtitle").textContent = subtitle;
  document.title = `${title} · fleetbench`;
}

/** What `settle` gives for work that failed (and whose failure it has shown). */
export const FAILED = Symbol("failed");

/**
 * Runs `work` (a function, sync or async) and gives its result; if it fails, shows why in
 * `target`, marks the page as errored and gives FAILED, so that a caller only checks.
 */
export async function settle(target, work) {
  try {
    return await work();
  } catch (error) {
    showError(target, error);
    done("error");
    return FAILED;
  }
}

/**
 * A question page's answer from the registry: the page marked loading and its answer box
 * hidden while asked; on failure the reason shown in `statusBox` and FAILED given.
 */
export async function askRegistry(statusBox, answerBox, path, query) {
  done("loading");
  message(statusBox, "info", "Asking the registry…");
  answerBox.hidden = true;
  const answer = await settle(statusBox, () => api(path, query));
  if (answer === FAILED) return FAILED;
  replace(statusBox);
  answerBox.hidden = false;
  return answer;
}

/** The named fields of a form that are filled in, trimmed, as query parameters. */
export function formQuery(form, names) {
  const data = new FormData(form);
  const query = {};
  for (const name of names) {
    const value = String(data.get(name) ?? "").trim();
    if (value !== "") query[name] = value;
  }
  return query;
}

/** The page's query parameters as a plain object. */
export function params() {
  return Object.fromEntries(new URLSearchParams(window.location.search));
}

// --- charts --------------------------------------------------------------------------

export const COLORS = [
  "#1f6feb",
  "#d1242f",
  "#1a7f37",
  "#8250df",
  "#bc4c00",
  "#0a7ea4",
  "#bf3989",
  "#6e7781",
];

/** Plotly reads a little HTML in labels; escape text so it shows as written. */
export function plotText(value) {
  return String(value ?? "")
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;");
}

const PLOT_CONFIG = {
  displaylogo: false,
  responsive: true,
  modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d"],
};

export function baseLayout(extra = {}) {
  return {
    margin: { l: 64, r: 64, t: 36, b: 56 },
    font: {
      family: "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
      size: 12,
      color: "#1f2328",
    },
    paper_bgcolor: "#ffffff",
    plot_bgcolor: "#ffffff",
    hovermode: "closest",
    legend: { orientation: "h", y: -0.2 },
    ...extra,
  };
}

/** Draw a chart into the element with this id; the element keeps plotly's `data`. */
export function plot(id, traces, layout) {
  if (!window.Plotly) throw new Error("The chart library (plotly.js) did not load.");
  const target = document.getElementById(id);
  target.hidden = false;
  return window.Plotly.newPlot(target, traces, layout, PLOT_CONFIG);
}

/** Concurrencies on a log2 axis with one tick per value measured. */
export function concurrencyAxis(values, title = "concurrency (B)") {
  const ticks = [...new Set(values)].sort((a, b) => a - b);
  return { title: { text: title }, type: "log", tickvals: ticks, ticktext: ticks.map(String) };
}

/** Mark the page as drawn (tests and the curious read document.body.dataset.state). */
export function done(state = "ready") {
  document.body.dataset.state = state;
}
