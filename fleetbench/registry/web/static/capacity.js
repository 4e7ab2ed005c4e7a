// How many nodes serve N users at X tokens/s each (GET /v1/capacity), the fewest or the
// cheapest: the plan as a table and a chart of the users each node takes, each class alone
// and its price, who was left out.
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
  pageUrl,
  params,
  plot,
  plotText,
  replace,
  settle,
} from "./common.js";

const FIELDS = [
  "model",
  "users",
  "min_tps_per_user",
  "context_tokens",
  "max_ttft_ms",
  "kind",
  "max_age_days",
  "reserve",
  "minimise",
];

const form = document.getElementById("question");
const statusBox = document.getElementById("status");
const answerBox = document.getElementById("answer");

/** The form's question, its reserved nodes ("a, b") as a list. */
function question() {
  const query = formQuery(form, FIELDS);
  if (query.reserve !== undefined) {
    query.reserve = query.reserve.split(",").map((name) => name.trim()).filter(Boolean);
  }
  return query;
}

function drawChart(answer) {
  const names = answer.plan.map((n) => plotText(n.node));
  const trace = {
    type: "bar",
    name: "users",
    x: names,
    y: answer.plan.map((n) => n.users),
    marker: { color: COLORS[0] },
    hovertemplate: "%{x}: %{y} users<extra></extra>",
  };
  const layout = baseLayout({
    title: { text: plotText(`${answer.model}: users each planned node takes`) },
    xaxis: { type: "category", automargin: true, title: { text: "node" } },
    yaxis: { title: { text: "users" }, rangemode: "tozero" },
  });
  return plot("capacity-chart", [trace], layout);
}

async function ask(query) {
  const answer = await askRegistry(statusBox, answerBox, "/v1/capacity", query);
  if (answer === FAILED) return;
  document.getElementById("reason").textContent = answer.reason;
  replace(
    document.querySelector("#plan tbody"),
    answer.plan.map((n) =>
      h(
        "tr",
        { dataset: { node: n.node } },
        h("td", {}, h("a", { href: curvesUrl(n.node, answer.model) }, n.node)),
        h("td", {}, n.hardware_class),
        h("td", { class: "num" }, String(n.users)),
        h("td", { class: "num" }, fmt(n.per_user_tps)),
        h("td", { class: "num" }, fmt(n.total_tps)),
        h("td", { class: "num" }, fmt(n.usd_per_hour)),
        h("td", {}, n.source === "serving" ? "serving run" : "offline curve"),
        h("td", {}, n.llama_cpp_build === null ? dash() : `b${n.llama_cpp_build}`),
        h("td", { class: "num" }, fmt(n.age_days, 1)),
      ),
    ),
  );
  replace(
    document.querySelector("#classes tbody"),
    answer.per_class.map((c) =>
      h(
        "tr",
        {},
        h("td", {}, c.hardware_class),
        h("td", { class: "num" }, c.nodes_needed === null ? "not enough" : String(c.nodes_needed)),
        h("td", { class: "num" }, String(c.nodes_available)),
        h("td", { class: "num" }, String(c.users_served)),
        h("td", { class: "num" }, fmt(c.usd_per_hour)),
        h("td", { class: "num" }, fmt(c.usd_per_million_tokens)),
      ),
    ),
  );
  document.getElementById("refused-section").hidden = answer.refused.length === 0;
  replace(
    document.querySelector("#refused tbody"),
    answer.refused.map((r) => h("tr", {}, h("td", {}, r.node), h("td", {}, r.reason))),
  );
  const planned = answer.plan.length > 0;
  document.getElementById("chart-card").hidden = !planned;
  if (planned && (await settle(statusBox, () => drawChart(answer))) === FAILED) return;
  done(planned ? "ready" : "empty");
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  window.history.replaceState(null, "", pageUrl("/capacity", formQuery(form, FIELDS)));
  ask(question());
});

const initial = params();
for (const field of FIELDS) {
  if (initial[field] !== undefined) form.elements[field].value = initial[field];
}
loadModelNames();
if (initial.model && initial.users && initial.min_tps_per_user) {
  ask(question());
} else {
  message(statusBox, "info", "Name a model, the users and the per-user speed, then plan.");
  done("idle");
}
