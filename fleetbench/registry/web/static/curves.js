// One node (its models), or one node x model: the batching curves from GET /v1/curves,
// one line per llama.cpp build, total and per-user decode speed on one chart, prefill beside,
// then tokens per joule and dollars per million tokens where the curves have them;
// and the node's latest serving run beside them: what the server delivered at each
// concurrency, as a share of the engine's throughput there.
import {
  api,
  ApiError,
  badge,
  baseLayout,
  COLORS,
  concurrencyAxis,
  curvesUrl,
  dash,
  done,
  FAILED,
  fmt,
  h,
  labelChips,
  message,
  params,
  placementUrl,
  plot,
  plotText,
  regressionsUrl,
  replace,
  setTitle,
  settle,
  showError,
  timeElement,
} from "./common.js";

const statusBox = document.getElementById("status");

/** node and model from /nodes/{node}[/models/{model}] or ?node=&model=. */
function address() {
  const path = window.location.pathname.split("/").map((part) => decodeURIComponent(part));
  if (path[1] === "nodes" && path[2]) {
    return { node: path[2], model: path[3] === "models" ? path.slice(4).join("/") || null : null };
  }
  const query = params();
  return { node: query.node || null, model: query.model || null };
}

function fact(term, ...value) {
  return [h("dt", {}, term), h("dd", {}, ...value)];
}

function engineText(engine) {
  if (!engine) return null;
  const parts = [engine.engine ?? "llama.cpp"];
  if (engine.build_number !== null && engine.build_number !== undefined) {
    parts.push(`b${engine.build_number}`);
  }
  if (engine.backend) parts.push(engine.backend);
  return parts.join(" ");
}

/** GET /v1/nodes/{name}; a name with a slash cannot be addressed so: find it in the list. */
async function nodeDetail(node) {
  if (!node.includes("/")) return api(`/v1/nodes/${encodeURIComponent(node)}`);
  const found = (await api("/v1/nodes")).data.find((n) => n.name === node);
  if (!found) throw new ApiError(404, `404 Not Found: node ${JSON.stringify(node)} not found`);
  return { ...found, fingerprints: [] };
}

async function showNode(node) {
  setTitle(node, "node");
  let detail;
  let runs;
  try {
    [detail, runs] = await Promise.all([nodeDetail(node), api("/v1/runs", { node, limit: 1000 })]);
  } catch (error) {
    showError(statusBox, error);
    done("error");
    return;
  }
  const latest = detail.fingerprints?.[0];
  replace(
    document.getElementById("node-facts"),
    fact(
      "Health",
      detail.health ? badge(detail.health) : dash(),
      detail.accelerator_note ? ` (${detail.accelerator_note})` : null,
    ),
    fact(
      "Hardware",
      detail.hardware ?? dash(),
      detail.below_class
        ? [
            " ",
            badge("below its class", "past knee"),
            ` ${Math.round(100 * detail.below_class.mbu)}% of its memory bandwidth at B = 1 on ` +
              `${detail.below_class.model}, against ${Math.round(100 * detail.below_class.class_median)}% ` +
              `for the ${detail.below_class.class_nodes} nodes of its class`,
          ]
        : null,
    ),
    fact("Engine", detail.engine ?? dash()),
    fact(
      "KV-cache maths",
      detail.kv_prediction_error_pct == null
        ? dash()
        : `${detail.kv_prediction_error_pct >= 0 ? "+" : ""}${detail.kv_prediction_error_pct.toFixed(1)}% of what llama.cpp allocated in the latest run`,
    ),
    fact("Last run", timeElement(detail.last_run_at)),
    fact("Runs", String(detail.runs)),
    fact(
      "Labels",
      Object.keys(detail.labels ?? {}).length ? labelChips(detail.labels) : dash(),
    ),
    fact(
      "Fingerprint",
      latest
        ? [
            h("code", { title: latest.hash }, latest.hash.slice(0, 16)),
            ` · reported ${latest.first_seen.slice(0, 10)} to ${latest.last_seen.slice(0, 10)}`,
          ]
        : dash(),
      detail.fingerprints?.length > 1
        ? ` (${detail.fingerprints.length} fingerprints over time)`
        : null,
    ),
    fact(
      "Open regressions",
      detail.open_regressions
        ? h("a", { href: regressionsUrl({ node }) }, String(detail.open_regressions))
        : detail.open_regressions === 0
          ? "0"
          : dash(),
    ),
  );
  // Runs come newest first: the first of each model is its latest.
  const models = new Map();
  for (const run of runs.data ?? []) {
    const entry = models.get(run.model);
    if (entry) entry.runs += 1;
    else models.set(run.model, { latest: run, runs: 1 });
  }
  const truncated = runs.count > (runs.data ?? []).length; // counts from the latest 1000 runs
  const tbody = document.querySelector("#models tbody");
  replace(
    tbody,
    [...models.entries()].map(([model, { latest: run, runs: count }]) =>
      h(
        "tr",
        { dataset: { model } },
        h("td", {}, h("a", { href: curvesUrl(node, model) }, model)),
        h("td", { class: "num" }, truncated ? `${count}+` : String(count)),
        h("td", {}, timeElement(run.started_at)),
        h(
          "td",
          {},
          h("span", { class: `badge ${run.status}` }, run.status),
          run.contended
            ? [" ", h("span", { class: "badge past-knee", title: run.contended }, "contended")]
            : null,
        ),
        h("td", {}, engineText(run.engine) ?? dash()),
        h("td", { class: "kv-check", title: run.kv_rules }, kvCheckText(run) ?? dash()),
      ),
    ),
  );
  document.getElementById("node-view").hidden = false;
  if (models.size === 0) {
    document.getElementById("models").hidden = true;
    message(statusBox, "empty", `${node} has not reported any run yet.`);
    done("empty");
    return;
  }
  done();
}

/** "18.0 MiB (predicted +0.4%)": the KV cache llama.cpp allocated against the fit maths
 * (the rules that predicted it in the cell's title). */
function kvCheckText(run) {
  if (run.kv_allocated_bytes == null) return null;
  const allocated = `${(run.kv_allocated_bytes / 2 ** 20).toFixed(1)} MiB`;
  const error = run.kv_prediction_error_pct;
  if (error == null) return allocated;
  return `${allocated} (predicted ${error >= 0 ? "+" : ""}${error.toFixed(1)}%)`;
}

function curveNames(curves) {
  const shapes = new Set(curves.map((c) => `${c.pp}/${c.tg}`));
  return curves.map((c) => (shapes.size > 1 ? `${c.label} · PP ${c.pp} TG ${c.tg}` : c.label));
}

/** Filled markers up to the knee, open ones past it. */
function symbols(points, shape) {
  return points.map((p) => (p.past_knee ? `${shape}-open` : shape));
}

function decodeTraces(curves, names) {
  const traces = [];
  const annotations = [];
  curves.forEach((curve, i) => {
    const color = COLORS[i % COLORS.length];
    const newest = i === curves.length - 1;
    const name = plotText(names[i]);
    const b = curve.points.map((p) => p.b);
    traces.push({
      type: "scatter",
      mode: "lines+markers",
      name: `${name}: total`,
      legendgroup: String(i),
      x: b,
      y: curve.points.map((p) => p.total_tps),
      line: { color, width: newest ? 3 : 1.5 },
      marker: { color, size: 8, symbol: symbols(curve.points, "circle") },
      hovertemplate: `${name}<br>B=%{x}: %{y:.2f} t/s total<extra></extra>`,
    });
    traces.push({
      type: "scatter",
      mode: "lines+markers",
      name: `${name}: per user`,
      legendgroup: String(i),
      x: b,
      y: curve.points.map((p) => p.per_user_tps),
      yaxis: "y2",
      line: { color, width: newest ? 2.5 : 1.2, dash: "dot" },
      marker: { color, size: 6, symbol: symbols(curve.points, "square") },
      hovertemplate: `${name}<br>B=%{x}: %{y:.2f} t/s per user<extra></extra>`,
    });
    const knee = curve.points.find((p) => p.b === curve.knee);
    if (knee) {
      traces.push({
        type: "scatter",
        mode: "markers",
        name: `${name}: knee`,
        legendgroup: String(i),
        showlegend: false,
        x: [knee.b],
        y: [knee.total_tps],
        marker: { color, size: 18, symbol: "star", line: { color: "#1f2328", width: 1 } },
        hovertemplate: `${name}<br>knee at B=%{x}: %{y:.2f} t/s total<extra></extra>`,
      });
      annotations.push({
        x: Math.log10(knee.b),
        y: knee.total_tps,
        text: `knee B=${knee.b}`,
        showarrow: true,
        arrowhead: 0,
        ax: 0,
        ay: -30 - 16 * i,
        font: { color, size: 11 },
      });
    }
  });
  return { traces, annotations };
}

const SERVER_COLOR = "#1f2328";

function serverName(serving) {
  const server = serving.server;
  return `server: ${server.kind}${server.build ? ` ${server.build}` : ""}`;
}

/** The serving run's output tokens/s (solid) and median user's speed (dotted), in black. */
function servingTraces(serving) {
  const name = plotText(serverName(serving));
  const points = serving.points.filter((p) => typeof p.total_tps === "number");
  const c = points.map((p) => p.concurrency);
  return [
    {
      type: "scatter",
      mode: "lines+markers",
      name: `${name}: total`,
      legendgroup: "server",
      x: c,
      y: points.map((p) => p.total_tps),
      line: { color: SERVER_COLOR, width: 3 },
      marker: {
        color: SERVER_COLOR,
        size: 9,
        symbol: points.map((p) =>
          serving.knee !== null && p.concurrency > serving.knee ? "diamond-open" : "diamond",
        ),
      },
      hovertemplate: `${name}<br>C=%{x}: %{y:.2f} t/s served<extra></extra>`,
    },
    {
      type: "scatter",
      mode: "lines+markers",
      name: `${name}: per user p50`,
      legendgroup: "server",
      x: c,
      y: points.map((p) => p.per_user_tps_p50),
      yaxis: "y2",
      line: { color: SERVER_COLOR, width: 2, dash: "dot" },
      marker: { color: SERVER_COLOR, size: 7, symbol: "diamond" },
      hovertemplate: `${name}<br>C=%{x}: %{y:.2f} t/s per user (median)<extra></extra>`,
    },
  ];
}

function servingRows(serving) {
  return serving.points.map((p) =>
    h(
      "tr",
      { dataset: { c: String(p.concurrency) } },
      h("td", { class: "num" }, String(p.concurrency)),
      h("td", { class: "num" }, fmt(p.total_tps)),
      h("td", { class: "num" }, p.of_offline_pct === null ? dash() : `${fmt(p.of_offline_pct, 1)} %`),
      h("td", { class: "num" }, fmt(p.per_user_tps_p50)),
      h("td", { class: "num" }, fmt(p.per_user_tps_p10)),
      h("td", { class: "num" }, fmt(p.ttft_ms_p90, 0)),
      h("td", { class: "num" }, fmt(p.itl_ms_p50, 1)),
      h(
        "td",
        {},
        p.concurrency === serving.knee
          ? h("span", { class: "badge ok" }, "knee")
          : serving.knee !== null && p.concurrency > serving.knee
            ? h("span", { class: "badge past-knee" }, "past knee")
            : "",
      ),
    ),
  );
}

function showServing(serving, curves) {
  const server = serving.server;
  const offline = curves.find((c) => c.run_id === serving.offline_run_id);
  replace(
    document.getElementById("serving-subtitle"),
    `${serverName(serving).slice("server: ".length)}`,
    server.slots ? ` · ${server.slots} slots of ${server.ctx_per_slot ?? "?"} tokens` : "",
    ` · prompt ${server.prompt_tokens}${server.prompt_exact ? "" : " (approximate)"}, output ` +
      `${server.gen_tokens} tokens · measured `,
    timeElement(serving.measured_at),
    offline
      ? ` · "of the engine's": the served tokens/s as a share of the engine's S_TG at that B in ` +
          `${offline.label}'s curve of the same lengths`
      : " · no offline curve of the same prompt and output lengths to compare with",
  );
  replace(document.querySelector("#serving-points tbody"), servingRows(serving));
  document.getElementById("serving-view").hidden = false;
}

/**
 * One line per curve of a figure some points may lack (prefill, tokens per joule, dollars
 * per million tokens), through the points that have it; `hover` the figure as %{y} formats it.
 */
function figureTraces(curves, names, figure, hover) {
  return curves
    .map((curve, i) => {
      const points = curve.points.filter((p) => typeof p[figure] === "number");
      const color = COLORS[i % COLORS.length];
      const name = plotText(names[i]);
      return {
        type: "scatter",
        mode: "lines+markers",
        name,
        x: points.map((p) => p.b),
        y: points.map((p) => p[figure]),
        line: { color, width: i === curves.length - 1 ? 3 : 1.5 },
        marker: { color, size: 8, symbol: symbols(points, "circle") },
        hovertemplate: `${name}<br>B=%{x}: ${hover}<extra></extra>`,
      };
    })
    .filter((trace) => trace.x.length > 0);
}

const NO_PRICE = "an admin sets one with fleetbench-registry price set";

/** "class A" or "classes A, B". */
function classesText(classes) {
  return `class${classes.length === 1 ? "" : "es"} ${classes.join(", ")}`;
}

/** Why no point has tokens per joule: no counter on the node, or its counter gave none. */
function energyMissing(curves) {
  const counted = curves.filter((c) => c.energy);
  if (counted.length === 0) return "No energy counted: the node has no counter the agent can read.";
  const sources = [...new Set(counted.map((c) => c.energy.source))];
  const reasons = [
    ...new Set(counted.flatMap((c) => c.points.map((p) => p.energy_invalid)).filter(Boolean)),
  ];
  return (
    `No energy figure: the counter (${sources.join(", ")}) gave none for any point` +
    `${reasons.length ? `: ${reasons.join("; ")}` : ""}.`
  );
}

/** What the figures cover (each counter's devices, nothing else) and which builds lack them. */
function energyScope(curves, names) {
  const counted = curves.flatMap((c, i) => (c.energy ? [[names[i], c.energy]] : []));
  const scopes = new Set(counted.map(([, e]) => `${e.scope}, read from ${e.source}`));
  const covers =
    scopes.size === 1
      ? [...scopes][0]
      : counted.map(([name, e]) => `${name}: ${e.scope}, read from ${e.source}`).join("; ");
  const uncounted = names.filter((_, i) => !curves[i].energy);
  const invalid = curves.flatMap((c) => c.points).filter((p) => p.energy_invalid).length;
  return (
    `What it counts: ${covers}; nothing else: not the rest of the node, its cooling or the ` +
    "facility." +
    (uncounted.length ? ` No energy counted in ${uncounted.join(", ")}.` : "") +
    (invalid ? ` ${invalid} point(s) without a figure: the table's Tokens / J says why.` : "")
  );
}

/** Why no point has a price: its class has none, or its runs name no class to price. */
function costMissing(curves) {
  const classes = [...new Set(curves.map((c) => c.hardware_class).filter(Boolean))];
  if (classes.length === 0) {
    return "No price: the runs report no hardware to name a class by, and prices are per class.";
  }
  return `No price for ${classesText(classes)}: ${NO_PRICE}.`;
}

/** The prices the figures come from, and the classes that have none. */
function costPrices(curves) {
  const priced = curves.filter((c) => c.usd_per_hour !== null);
  const prices = [
    ...new Set(priced.map((c) => `$${fmt(c.usd_per_hour)} an hour for ${c.hardware_class}`)),
  ];
  const unpriced = [
    ...new Set(curves.filter((c) => c.usd_per_hour === null).map((c) => c.hardware_class)),
  ].filter(Boolean);
  return (
    `At ${prices.join("; ")} (the class's price, GET /v1/prices).` +
    (unpriced.length ? ` No price for ${classesText(unpriced)}: ${NO_PRICE}.` : "")
  );
}

/**
 * Tokens per joule and dollars per million tokens against B, each drawn only where a point
 * has the figure; where none has, one line in its place says what is missing.
 */
async function drawEnergyAndCost(curves, names) {
  const figures = [
    {
      id: "energy",
      traces: figureTraces(curves, names, "tokens_per_joule", "%{y:.2f} tokens/J"),
      axis: "tokens per joule",
      note: () => energyScope(curves, names),
      missing: () => energyMissing(curves),
    },
    {
      id: "cost",
      traces: figureTraces(curves, names, "usd_per_million_tokens", "$%{y:.2f} per million tokens"),
      axis: "$ per million tokens",
      note: () => costPrices(curves),
      missing: () => costMissing(curves),
    },
  ];
  for (const { id, traces, axis, note, missing } of figures) {
    const shown = traces.length > 0;
    document.getElementById(`${id}-card`).hidden = !shown;
    const missingLine = document.getElementById(`${id}-missing`);
    missingLine.hidden = shown;
    if (!shown) {
      missingLine.textContent = missing();
      continue;
    }
    document.getElementById(`${id}-note`).textContent = note();
    await plot(
      `${id}-chart`,
      traces,
      baseLayout({
        xaxis: concurrencyAxis(traces.flatMap((t) => t.x)),
        yaxis: { title: { text: axis }, rangemode: "tozero" },
        showlegend: true, // plotly names no lone line, and one build's may be all there is
      }),
    );
  }
}

/** A point's tokens per joule; where the counter gave none, why, on hover. */
function energyCell(p) {
  if (p.tokens_per_joule !== null) return fmt(p.tokens_per_joule);
  if (p.energy_invalid) return h("span", { class: "muted", title: p.energy_invalid }, "no figure");
  return dash();
}

function pointRows(curves, names) {
  const rows = [];
  curves.forEach((curve, i) => {
    for (const p of curve.points) {
      rows.push(
        h(
          "tr",
          { dataset: { build: curve.label, b: String(p.b) } },
          h("td", {}, names[i]),
          h("td", { class: "num" }, `${curve.pp} / ${curve.tg}`),
          h("td", { class: "num" }, String(p.b)),
          h("td", { class: "num" }, fmt(p.total_tps)),
          h("td", { class: "num" }, fmt(p.per_user_tps)),
          h("td", { class: "num" }, fmt(p.ms_per_token, 1)),
          h("td", { class: "num" }, fmt(p.prefill_tps)),
          h(
            "td",
            {
              class: "num",
              title: curve.bandwidth
                ? `of ${fmt(curve.bandwidth.bytes_per_s / 1e9)} GB/s (${curve.bandwidth.source}` +
                  `${curve.bandwidth.detail ? `: ${curve.bandwidth.detail}` : ""})`
                : "the node's memory bandwidth is unknown",
            },
            p.mbu == null ? dash() : `${Math.round(100 * p.mbu)}%`,
          ),
          h("td", { class: "num" }, energyCell(p)),
          h(
            "td",
            {
              class: "num",
              title:
                curve.usd_per_hour === null
                  ? `no price for ${curve.hardware_class ?? "its hardware, which names no class"}`
                  : `at $${fmt(curve.usd_per_hour)} an hour for ${curve.hardware_class}`,
            },
            p.usd_per_million_tokens === null ? dash() : fmt(p.usd_per_million_tokens),
          ),
          h(
            "td",
            {},
            p.b === curve.knee
              ? h("span", { class: "badge ok" }, "knee")
              : p.past_knee
                ? h("span", { class: "badge past-knee" }, "past knee")
                : "",
          ),
          h("td", {}, timeElement(curve.measured_at)),
        ),
      );
    }
  });
  return rows;
}

async function showCurves(node, model) {
  setTitle(`${node} × ${model}`, "batching curves");
  replace(
    document.getElementById("breadcrumb"),
    h("a", { href: "/" }, "Fleet"),
    " / ",
    h("a", { href: curvesUrl(node) }, node),
  );
  const answer = await settle(statusBox, () => api("/v1/curves", { node, model }));
  if (answer === FAILED) return;
  const curves = answer.curves ?? [];
  setTitle(
    `${answer.node} × ${answer.model}`,
    `${curves.length} curve${curves.length === 1 ? "" : "s"} · the knee: the largest concurrency ` +
      `before an added user brings less than ${Math.round(answer.knee_threshold * 100)}% ` +
      "of a lone user's speed",
  );
  replace(
    document.getElementById("links"),
    h("a", { href: placementUrl({ model: answer.model }) }, "Ask placement for this model"),
    " · ",
    h("a", { href: regressionsUrl({ node: answer.node, model: answer.model }) }, "Regressions"),
  );
  const serving = answer.serving;
  if (curves.length === 0 && !serving) {
    message(statusBox, "empty", `No successful run of ${answer.model} on ${answer.node} yet.`);
    done("empty");
    return;
  }
  const names = curveNames(curves);
  document.getElementById("curves-view").hidden = false;
  replace(document.querySelector("#points tbody"), pointRows(curves, names));
  for (const id of ["points", "points-heading"]) {
    document.getElementById(id).hidden = curves.length === 0;
  }
  if (serving) showServing(serving, curves);
  const allB = [
    ...curves.flatMap((c) => c.points.map((p) => p.b)),
    ...(serving?.points ?? []).map((p) => p.concurrency),
  ];
  try {
    const { traces, annotations } = decodeTraces(curves, names);
    if (serving) traces.push(...servingTraces(serving));
    await plot(
      "decode-chart",
      traces,
      baseLayout({
        xaxis: concurrencyAxis(allB),
        yaxis: { title: { text: "total decode tokens/s" }, rangemode: "tozero" },
        yaxis2: {
          title: { text: "tokens/s per user" },
          overlaying: "y",
          side: "right",
          rangemode: "tozero",
          showgrid: false,
          tickmode: "auto",
        },
        annotations,
      }),
    );
    const prefill = figureTraces(curves, names, "prefill_tps", "%{y:.2f} t/s prefill");
    if (prefill.length === 0) {
      document.getElementById("prefill-chart").hidden = true;
      message(document.getElementById("prefill-status"), "empty", "No prefill speed was measured.");
    } else {
      await plot(
        "prefill-chart",
        prefill,
        baseLayout({
          xaxis: concurrencyAxis(allB),
          yaxis: { title: { text: "prefill tokens/s (S_PP)" }, rangemode: "tozero" },
        }),
      );
    }
    if (curves.length > 0) await drawEnergyAndCost(curves, names);
  } catch (error) {
    showError(statusBox, error);
    done("error");
    return;
  }
  done();
}

const { node, model } = address();
if (!node) {
  setTitle("Curves");
  message(statusBox, "info", "Pick a node on the fleet page.");
  done("empty");
} else if (!model) {
  showNode(node);
} else {
  showCurves(node, model);
}
