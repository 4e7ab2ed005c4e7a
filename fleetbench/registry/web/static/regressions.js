// Detected regressions and improvements (GET /v1/regressions), each linked to its timeline.
import {
  api,
  curvesUrl,
  dash,
  done,
  fmt,
  fmtPct,
  formQuery,
  h,
  message,
  METRICS,
  params,
  regressionsUrl,
  replace,
  seriesUrl,
  showError,
  timeElement,
} from "./common.js";

const TEXT_FIELDS = ["node", "model", "since", "min_change"];
const FLAGS = ["include_improvements", "include_acknowledged"];

const form = document.getElementById("filters");
const statusBox = document.getElementById("status");
const table = document.getElementById("regressions");
const countLine = document.getElementById("count");

/** What the row's series is, and its before → after: a point's speed, a curve's knee, or the
 * model's outputs (a KL divergence from the run before, against the series' floor). */
function seriesCells(r) {
  if (r.metric === "knee") {
    return [`PP ${r.pp} · TG ${r.tg} · knee`, `B ${r.before} → B ${r.after}`];
  }
  if (r.metric === "outputs") {
    return ["outputs", `KL ${fmt(r.before, 4)} → ${fmt(r.after, 4)} nats`];
  }
  const metric = r.metric === "s_pp" ? "prefill" : "decode";
  return [`PP ${r.pp} · TG ${r.tg} · B ${r.b} · ${metric}`, `${fmt(r.before)} → ${fmt(r.after)}`];
}

function regressionRow(r) {
  const knee = r.metric === "knee";
  const outputs = r.metric === "outputs";
  const [series, values] = seriesCells(r);
  return h(
    "tr",
    { dataset: { id: String(r.id), kind: r.kind } },
    h("td", {}, timeElement(r.first_seen_at)),
    h("td", {}, h("a", { href: curvesUrl(r.node) }, r.node)),
    h("td", {}, h("a", { href: curvesUrl(r.node, r.model) }, r.model)),
    h("td", { title: METRICS[r.metric] ?? r.metric }, series),
    h(
      "td",
      { class: "num", title: outputs ? "top tokens that changed, % of positions" : null },
      h("span", { class: `badge ${r.kind}` }, fmtPct(r.change_pct)),
    ),
    h("td", { class: "num nowrap" }, values),
    h("td", { class: "num" }, knee || outputs ? dash() : `±${fmt(r.noise_pct, 1)} %`),
    h("td", { class: "num" }, `${fmt(r.confidence * 100, 0)} %`),
    h(
      "td",
      { class: "wide" },
      r.cause,
      (r.cause_kinds ?? []).length
        ? h("div", {}, r.cause_kinds.map((k) => h("span", { class: "chip" }, k)))
        : null,
    ),
    h(
      "td",
      {},
      r.acknowledged_at
        ? [
            h("span", { class: "badge" }, "acknowledged"),
            r.note ? h("div", { class: "muted" }, r.note) : null,
          ]
        : h("span", { class: "badge regressed" }, "open"),
    ),
    h(
      "td",
      {},
      knee || outputs
        ? h("a", { href: curvesUrl(r.node, r.model) }, "curves")
        : h("a", { href: seriesUrl(r) }, "timeline"),
    ),
  );
}

function filtersFromForm() {
  const filters = formQuery(form, TEXT_FIELDS);
  for (const flag of FLAGS) if (form.elements[flag].checked) filters[flag] = "true";
  return filters;
}

/** The form's date is the start of that day, UTC. */
function apiQuery(filters) {
  const query = { ...filters };
  if (query.since) query.since = `${query.since}T00:00:00Z`;
  return query;
}

async function load(filters) {
  done("loading");
  table.hidden = true;
  message(statusBox, "info", "Loading…");
  let answer;
  try {
    answer = await api("/v1/regressions", apiQuery(filters));
  } catch (error) {
    countLine.textContent = "";
    showError(statusBox, error);
    done("error");
    return;
  }
  const items = answer.data ?? [];
  const regressions = items.filter((r) => r.kind === "regression").length;
  countLine.textContent = `${regressions} regression${regressions === 1 ? "" : "s"}, ${
    items.length - regressions
  } improvement${items.length - regressions === 1 ? "" : "s"}${
    answer.count > items.length ? ` (first ${items.length} of ${answer.count})` : ""
  }`;
  replace(table.querySelector("tbody"), items.map(regressionRow));
  if (items.length === 0) {
    const filtered = Object.keys(filters).some((k) => !FLAGS.includes(k));
    message(
      statusBox,
      "empty",
      filtered
        ? "Nothing detected for these filters."
        : "No regressions detected: every series holds steady.",
    );
    done("empty");
    return;
  }
  replace(statusBox);
  table.hidden = false;
  done();
}

const initial = params();
for (const key of TEXT_FIELDS) {
  if (initial[key] !== undefined) form.elements[key].value = initial[key];
}
for (const flag of FLAGS) form.elements[flag].checked = initial[flag] === "true";

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const filters = filtersFromForm();
  window.history.replaceState(null, "", regressionsUrl(filters));
  load(filters);
});

load(filtersFromForm());
