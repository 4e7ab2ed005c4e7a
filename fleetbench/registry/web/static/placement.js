// The placement question as a form; the answer (GET /v1/placement) as a table and a chart.
import {
  askRegistry,
  baseLayout,
  COLORS,
  curvesUrl,
  dash,
  done,
  FAILED,
  fmt,
  formQuery,
  h,
  loadModelNames,
  message,
  params,
  placementUrl,
  plot,
  plotText,
  replace,
  settle,
  timeElement,
} from "./common.js";

const FIELDS = [
  "model",
  "min_tps_per_user",
  "prompt_tokens",
  "context_tokens",
  "max_age_days",
  "max_ttft_ms",
  "kind",
  "order",
  "limit",
];

// How each order lists the candidates, as the count and the chart's title say it.
const ORDERS = {
  throughput: { listed: "with the highest total throughput", title: "best total throughput" },
  cost: { listed: "cheapest per million tokens", title: "cheapest per million tokens first" },
};

const form = document.getElementById("question");
const statusBox = document.getElementById("status");
const answerBox = document.getElementById("answer");

/** show(value), or a dash for a field this registry does not send. */
function orDash(value, show) {
  return value === undefined || value === null ? dash() : show(value);
}

/** Whose price the candidate's class has, or that it has none. */
function priceTitle(candidate) {
  const named = candidate.hardware_class ?? "its hardware, which names no class";
  return candidate.usd_per_hour === null
    ? `no price for ${named}: an admin sets one with fleetbench-registry price set`
    : `the price of ${named}`;
}

function candidateRow(candidate, index, model) {
  const pastKnee =
    candidate.past_knee === true
      ? h("span", { class: "badge past-knee" }, "past knee")
      : candidate.past_knee === false
        ? h("span", { class: "badge ok" }, "up to knee")
        : dash();
  return h(
    "tr",
    { dataset: { node: candidate.node } },
    h("td", { class: "num" }, String(index + 1)),
    h("td", {}, h("a", { href: curvesUrl(candidate.node, model) }, candidate.node)),
    h("td", { class: "num" }, String(candidate.concurrency)),
    h("td", { class: "num" }, fmt(candidate.per_user_tps)),
    h("td", { class: "num" }, fmt(candidate.total_tps)),
    h(
      "td",
      { class: "num", title: priceTitle(candidate) },
      orDash(candidate.usd_per_million_tokens, fmt),
    ),
    h("td", { class: "num", title: priceTitle(candidate) }, orDash(candidate.usd_per_hour, fmt)),
    h(
      "td",
      {
        class: "num",
        title: candidate.energy_source ? `counted by ${candidate.energy_source}` : null,
      },
      orDash(candidate.tokens_per_joule, fmt),
    ),
    h("td", { class: "num" }, orDash(candidate.ttft_ms_p90, (ms) => fmt(ms, 0))),
    h(
      "td",
      { class: "nowrap" },
      candidate.source === "serving"
        ? `${candidate.server ?? "server"}${candidate.slots ? ` (${candidate.slots} slots)` : ""}`
        : candidate.engine_on_accelerator === false
          ? h("span", { class: "badge off", title: "its engine ran on the CPU" }, "CPU, not its GPU")
          : "offline curve",
    ),
    h("td", { class: "num" }, fmt(candidate.prefill_tps)),
    h("td", { class: "num nowrap" }, `${candidate.prompt_tokens} / ${candidate.gen_tokens}`),
    h(
      "td",
      { class: "nowrap" },
      candidate.llama_cpp_build === null ? dash() : `b${candidate.llama_cpp_build}`,
    ),
    h("td", {}, pastKnee),
    h(
      "td",
      { class: "num", title: candidate.kv_rules },
      candidate.kv_cache_gib === null && candidate.kv_rules?.startsWith("fit unknown")
        ? candidate.kv_rules
        : orDash(candidate.kv_cache_gib, fmt),
    ),
    h(
      "td",
      {},
      orDash(candidate.fit, (fit) =>
        h(
          "span",
          {
            class: fit === "fits" ? "badge fits" : "badge",
            title: candidate.fit_basis ? `checked against ${candidate.fit_basis}` : null,
          },
          fit === "fits" && candidate.fit_basis === "predicted only" ? "fits (predicted)" : fit,
        ),
      ),
    ),
    h("td", {}, timeElement(candidate.measured_at)),
  );
}

function drawChart(answer) {
  const candidates = answer.candidates;
  const names = candidates.map((c) => plotText(c.node));
  const hover = candidates.map((c) => `${plotText(c.node)}<br>B=${c.concurrency}`);
  const traces = [
    {
      type: "bar",
      name: "total tokens/s",
      x: names,
      y: candidates.map((c) => c.total_tps),
      text: hover,
      textposition: "none",
      hovertemplate: "%{text}<br>total %{y:.2f} t/s<extra></extra>",
      marker: { color: COLORS[0] },
    },
    {
      type: "scatter",
      mode: "markers",
      name: "per-user tokens/s",
      x: names,
      y: candidates.map((c) => c.per_user_tps),
      yaxis: "y2",
      text: hover,
      hovertemplate: "%{text}<br>per user %{y:.2f} t/s<extra></extra>",
      marker: { color: COLORS[1], size: 10, symbol: "diamond" },
    },
  ];
  const layout = baseLayout({
    title: {
      text: plotText(
        `${answer.model}: ${ORDERS[answer.order].title} at ≥ ${answer.min_tps_per_user} t/s per user`,
      ),
    },
    xaxis: {
      title: { text: "node (at its chosen concurrency)" },
      type: "category",
      automargin: true,
    },
    yaxis: { title: { text: "total tokens/s" }, rangemode: "tozero" },
    yaxis2: {
      title: { text: "per-user tokens/s" },
      overlaying: "y",
      side: "right",
      rangemode: "tozero",
      showgrid: false,
      tickmode: "auto",
    },
    shapes: [
      {
        type: "line",
        xref: "paper",
        x0: 0,
        x1: 1,
        yref: "y2",
        y0: answer.min_tps_per_user,
        y1: answer.min_tps_per_user,
        line: { color: COLORS[1], dash: "dash", width: 1 },
      },
    ],
    annotations: [
      {
        xref: "paper",
        x: 1,
        xanchor: "right",
        yref: "y2",
        y: answer.min_tps_per_user,
        yanchor: "bottom",
        text: `asked: ${answer.min_tps_per_user} t/s per user`,
        showarrow: false,
        font: { color: COLORS[1], size: 11 },
      },
    ],
  });
  return plot("placement-chart", traces, layout);
}

async function ask(query) {
  const answer = await askRegistry(statusBox, answerBox, "/v1/placement", query);
  if (answer === FAILED) return;
  document.getElementById("reason").textContent = answer.reason;
  const count = answer.candidates.length;
  document.getElementById("count").textContent =
    answer.count > count
      ? `${answer.count} node(s) qualify; the ${count} ${ORDERS[answer.order].listed} are shown.`
      : `${answer.count} node(s) qualify.`;
  replace(
    document.querySelector("#candidates tbody"),
    answer.candidates.map((c, i) => candidateRow(c, i, answer.model)),
  );
  document.getElementById("candidates").hidden = count === 0;
  const chartCard = document.getElementById("chart-card");
  chartCard.hidden = count === 0;
  const rejected = answer.rejected ?? [];
  document.getElementById("rejected-section").hidden = rejected.length === 0;
  replace(
    document.querySelector("#rejected tbody"),
    rejected.map((r) =>
      h(
        "tr",
        {},
        h("td", {}, h("a", { href: curvesUrl(r.node, answer.model) }, r.node)),
        h("td", { class: "num" }, String(r.concurrency)),
        h("td", { class: "num" }, orDash(r.kv_cache_gib, fmt)),
        h("td", { class: "wide" }, r.reason),
      ),
    ),
  );
  if (count > 0) {
    if ((await settle(statusBox, () => drawChart(answer))) === FAILED) return;
  }
  done(count > 0 ? "ready" : "empty");
}

function queryFromForm() {
  return formQuery(form, FIELDS);
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const query = queryFromForm();
  window.history.replaceState(null, "", placementUrl(query));
  ask(query);
});

const initial = params();
for (const field of FIELDS) {
  if (initial[field] !== undefined) form.elements[field].value = initial[field];
}
loadModelNames();
if (initial.model && initial.min_tps_per_user) {
  ask(queryFromForm());
} else {
  message(statusBox, "info", "Name a model and the per-user speed it needs, then ask.");
  done("idle");
}
