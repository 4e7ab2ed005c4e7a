// One series over time (GET /v1/series), with each change of build, binding, hardware or
// settings marked by a vertical line and its detected steps by a cross.
import {
  absoluteTime,
  api,
  baseLayout,
  COLORS,
  curvesUrl,
  dash,
  done,
  FAILED,
  fmt,
  fmtPct,
  formQuery,
  h,
  message,
  METRICS,
  params,
  plot,
  plotText,
  regressionsUrl,
  replace,
  seriesUrl,
  settle,
  timeElement,
} from "./common.js";

const KEYS = ["node", "model", "pp", "tg", "b", "metric"];

const form = document.getElementById("series-form");
const statusBox = document.getElementById("status");

function query() {
  return formQuery(form, KEYS);
}

function chart(series) {
  const points = series.points;
  const builds = [...new Set(points.map((p) => p.build ?? "unknown build"))];
  const colorOf = (p) => COLORS[builds.indexOf(p.build ?? "unknown build") % COLORS.length];
  const traces = [
    {
      type: "scatter",
      mode: "lines+markers",
      name: plotText(METRICS[series.metric] ?? series.metric),
      x: points.map((p) => p.started_at),
      y: points.map((p) => p.value),
      text: points.map((p) => plotText(p.build ?? "unknown build")),
      line: { color: "#6e7781", width: 1.5 },
      marker: { size: 9, color: points.map(colorOf) },
      hovertemplate: "%{x}<br>%{y:.2f} t/s<br>%{text}<extra></extra>",
    },
  ];
  const firstRuns = new Set((series.regressions ?? []).map((r) => r.first_run_id));
  const stepPoints = points.filter((p) => firstRuns.has(p.run_id));
  if (stepPoints.length) {
    traces.push({
      type: "scatter",
      mode: "markers",
      name: "step detected",
      x: stepPoints.map((p) => p.started_at),
      y: stepPoints.map((p) => p.value),
      marker: {
        size: 16,
        symbol: "x-thin-open",
        color: COLORS[1],
        line: { width: 3, color: COLORS[1] },
      },
      hovertemplate: "step begins %{x}<extra></extra>",
    });
  }
  const changes = points.filter((p) => p.change);
  const shapes = changes.map((p) => ({
    type: "line",
    xref: "x",
    yref: "paper",
    x0: p.started_at,
    x1: p.started_at,
    y0: 0,
    y1: 1,
    line: { color: "#9a6700", width: 1.5, dash: "dash" },
  }));
  const annotations = changes.map((p, i) => ({
    xref: "x",
    yref: "paper",
    x: p.started_at,
    y: 1,
    yshift: -14 * (i % 3),
    xanchor: "left",
    yanchor: "top",
    text: plotText(p.change),
    showarrow: false,
    bgcolor: "rgba(255,255,255,0.85)",
    font: { size: 11, color: "#9a6700" },
  }));
  return plot(
    "series-chart",
    traces,
    baseLayout({
      xaxis: { title: { text: "run started (UTC)" }, type: "date" },
      yaxis: {
        title: { text: plotText(METRICS[series.metric] ?? series.metric) },
        rangemode: "tozero",
      },
      shapes,
      annotations,
      showlegend: stepPoints.length > 0,
    }),
  );
}

function regressionRow(r) {
  return h(
    "tr",
    { dataset: { id: String(r.id) } },
    h("td", {}, timeElement(r.first_seen_at)),
    h("td", {}, h("span", { class: `badge ${r.kind}` }, r.kind)),
    h("td", { class: "num" }, fmtPct(r.change_pct)),
    h("td", { class: "num nowrap" }, `${fmt(r.before)} → ${fmt(r.after)}`),
    h("td", { class: "num" }, `${fmt(r.confidence * 100, 0)} %`),
    h("td", {}, r.cause),
    h(
      "td",
      {},
      r.acknowledged_at
        ? ["acknowledged", r.note ? h("div", { class: "muted" }, r.note) : null]
        : "open",
    ),
  );
}

function pointRow(p) {
  return h(
    "tr",
    { dataset: { run: p.run_id } },
    h("td", { class: "nowrap" }, absoluteTime(p.started_at)),
    h("td", { class: "num" }, fmt(p.value)),
    h("td", {}, p.build ?? dash()),
    h("td", {}, p.binding ?? dash()),
    h("td", {}, p.fingerprint ?? dash()),
    h("td", {}, p.change ? h("strong", {}, p.change) : ""),
  );
}

async function load(q) {
  done("loading");
  document.getElementById("series-view").hidden = true;
  message(statusBox, "info", "Loading…");
  const series = await settle(statusBox, () => api("/v1/series", q));
  if (series === FAILED) return;
  const metric = series.metric === "s_pp" ? "prefill" : "decode";
  const title = `${series.node} × ${series.model}`;
  document.getElementById("title").textContent = title;
  document.title = `${title} · series · fleetbench`;
  const detectable =
    series.min_detectable_change_pct == null
      ? ""
      : ` · shows steps of ${series.min_detectable_change_pct.toFixed(1)}% and more at a new build`;
  document.getElementById("subtitle").textContent =
    `PP ${series.pp} · TG ${series.tg} · B ${series.b} · ${metric} tokens/s · ` +
    `${series.points.length} run(s)${detectable}`;
  const csv = new URLSearchParams({ ...q, format: "csv" });
  replace(
    document.getElementById("links"),
    h("a", { href: curvesUrl(series.node, series.model) }, "Curves"),
    " · ",
    h(
      "a",
      { href: regressionsUrl({ node: series.node, model: series.model }) },
      "Regressions of this node and model",
    ),
    " · ",
    h("a", { href: `/v1/series?${csv}`, download: "series.csv" }, "CSV"),
  );
  if (series.points.length === 0) {
    message(statusBox, "empty", "No run has measured this series.");
    done("empty");
    return;
  }
  replace(statusBox);
  document.getElementById("series-view").hidden = false;
  replace(document.querySelector("#series-points tbody"), series.points.map(pointRow));
  const regressions = series.regressions ?? [];
  document.getElementById("regressions-section").hidden = regressions.length === 0;
  replace(document.querySelector("#series-regressions tbody"), regressions.map(regressionRow));
  if ((await settle(statusBox, () => chart(series))) === FAILED) return;
  done();
}

const initial = params();
for (const key of KEYS) {
  if (initial[key] !== undefined) form.elements[key].value = initial[key];
}
form.addEventListener("submit", (event) => {
  event.preventDefault();
  const q = query();
  window.history.replaceState(null, "", seriesUrl(q));
  load(q);
});
const q = query();
if (["node", "model", "pp", "tg", "b"].every((key) => q[key] !== undefined)) {
  load(q);
} else {
  message(statusBox, "info", "Name a series: node, model, PP, TG and B (regressions link here).");
  done("idle");
}
