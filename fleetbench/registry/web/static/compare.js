// Two builds compared across the fleet (GET /v1/compare): the verdict per hardware class,
// each node's new/old ratio per B drawn, and every point as a table.
import {
  askRegistry,
  baseLayout,
  badge,
  COLORS,
  concurrencyAxis,
  curvesUrl,
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

const FIELDS = ["model", "from_build", "to_build", "kind", "max_age_days"];
const METRIC_NAMES = {
  s_tg: "S_TG",
  s_pp: "S_PP",
  per_user_tps_p10: "per-user p10",
  ttft_ms_p90: "TTFT p90",
  joules_per_token: "energy per token",
};
const VERDICT_BADGES = { go: "ok", hold: "regressed", unknown: "stale" };

const form = document.getElementById("question");
const statusBox = document.getElementById("status");
const answerBox = document.getElementById("answer");

function verdictBadge(verdict) {
  return badge(verdict, VERDICT_BADGES[verdict] ?? verdict);
}

function pointRow(node, point, model) {
  const flag = point.beyond_detection ? (point.worse_pct > 0 ? " worse" : " better") : "";
  // joules per token are small (0.0123 J): two decimals would hide the change
  const digits = point.metric === "joules_per_token" ? 4 : 2;
  return h(
    "tr",
    { dataset: { node: node.node, metric: point.metric, b: String(point.b) } },
    h("td", {}, h("a", { href: curvesUrl(node.node, model) }, node.node)),
    h("td", {}, METRIC_NAMES[point.metric] ?? point.metric),
    h("td", { class: "num nowrap" }, `${point.pp} / ${point.tg}`),
    h("td", { class: "num" }, String(point.b)),
    h("td", { class: "num" }, fmt(point.from_value, digits)),
    h("td", { class: "num" }, fmt(point.to_value, digits)),
    h("td", { class: "num nowrap" }, `${fmt(point.ratio, 3)}${flag}`),
    h("td", { class: "num nowrap" }, `${fmt(point.ratio_low, 3)}–${fmt(point.ratio_high, 3)}`),
    h("td", { class: "num" }, `${fmt(point.detectable_pct, 1)}%`),
  );
}

/** Each node's ratio per B of the first metric (S_TG, or per-user p10 for serving). */
function drawChart(answer) {
  const metric = answer.kind === "serving" ? "per_user_tps_p10" : "s_tg";
  const traces = answer.nodes.map((node, i) => {
    const points = node.points.filter((p) => p.metric === metric);
    return {
      type: "scatter",
      mode: "lines+markers",
      name: plotText(node.node),
      x: points.map((p) => p.b),
      y: points.map((p) => p.ratio),
      error_y: {
        type: "data",
        symmetric: false,
        array: points.map((p) => p.ratio_high - p.ratio),
        arrayminus: points.map((p) => p.ratio - p.ratio_low),
      },
      line: { color: COLORS[i % COLORS.length] },
      hovertemplate: `${plotText(node.node)}<br>B=%{x}: %{y:.3f}<extra></extra>`,
    };
  });
  const bs = answer.nodes.flatMap((n) => n.points.map((p) => p.b));
  const layout = baseLayout({
    title: {
      text: plotText(`${answer.model}: ${METRIC_NAMES[metric]}, new build / old, per node`),
    },
    xaxis: concurrencyAxis(bs, answer.kind === "serving" ? "concurrency" : "concurrency (B)"),
    yaxis: { title: { text: "ratio (1 = unchanged)" } },
    shapes: [
      {
        type: "line",
        xref: "paper",
        x0: 0,
        x1: 1,
        y0: 1,
        y1: 1,
        line: { color: "#6e7781", dash: "dash", width: 1 },
      },
    ],
  });
  return plot("compare-chart", traces, layout);
}

async function ask(query) {
  const answer = await askRegistry(statusBox, answerBox, "/v1/compare", query);
  if (answer === FAILED) return;
  replace(document.getElementById("verdict"), verdictBadge(answer.verdict));
  document.getElementById("reason").textContent = answer.reason;
  replace(
    document.querySelector("#classes tbody"),
    answer.classes.map((c) =>
      h(
        "tr",
        { dataset: { class: c.hardware_class } },
        h("td", {}, c.hardware_class),
        h(
          "td",
          { class: "nowrap" },
          verdictBadge(c.verdict),
          c.efficiency ? [" ", badge("more energy per token", "costlier")] : null,
        ),
        h("td", { class: "num" }, String(c.nodes_compared)),
        h(
          "td",
          { class: "wide" },
          c.reason,
          // a hold on energy (FLEETBENCH_COMPARE_HOLD_ON_ENERGY) already gives it as the reason
          c.efficiency && c.efficiency !== c.reason
            ? h("p", { class: "efficiency" }, c.efficiency)
            : null,
          // changed outputs hold the class and are its reason already
          c.outputs && c.outputs.state !== "changed"
            ? h("p", { class: "outputs" }, c.outputs.reason)
            : null,
        ),
      ),
    ),
  );
  replace(
    document.querySelector("#points tbody"),
    answer.nodes.flatMap((node) => node.points.map((p) => pointRow(node, p, answer.model))),
  );
  const notCompared = answer.not_compared;
  document.getElementById("not-compared-section").hidden = notCompared.length === 0;
  replace(
    document.querySelector("#not-compared tbody"),
    notCompared.map((n) =>
      h("tr", {}, h("td", {}, n.node), h("td", {}, n.hardware_class ?? ""), h("td", {}, n.reason)),
    ),
  );
  const compared = answer.nodes.length > 0;
  document.getElementById("chart-card").hidden = !compared;
  document.getElementById("points").hidden = !compared;
  if (compared && (await settle(statusBox, () => drawChart(answer))) === FAILED) return;
  done(compared ? "ready" : "empty");
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const query = formQuery(form, FIELDS);
  window.history.replaceState(null, "", pageUrl("/compare", query));
  ask(query);
});

const initial = params();
for (const field of FIELDS) {
  if (initial[field] !== undefined) form.elements[field].value = initial[field];
}
loadModelNames();
if (initial.model && initial.from_build && initial.to_build) {
  ask(formQuery(form, FIELDS));
} else {
  message(statusBox, "info", "Name a model and the two builds, then compare.");
  done("idle");
}
