// The sweep plans (GET /v1/plans) and, from GET /v1/nodes, which nodes run or skip each.
import {
  api,
  badge,
  curvesUrl,
  dash,
  done,
  h,
  labelChips,
  message,
  replace,
  showError,
  timeElement,
} from "./common.js";

const table = document.getElementById("plans");
const statusBox = document.getElementById("status");

function selector(plan) {
  const named = plan.nodes.map((node) => h("span", { class: "chip" }, node));
  const labelled = labelChips(plan.labels);
  if (named.length === 0 && labelled.length === 0) return "every node";
  return [...named, ...labelled];
}

// Without a reader or admin token the registry leaves out paths, binaries and server URLs.
function model(plan) {
  if (plan.kind === "serving") return `${plan.model.name} (served at ${plan.url ?? "a hidden URL"})`;
  const searched = plan.model.search_dirs.length ? `search ${plan.model.search_dirs.join(", ")}` : null;
  const where = plan.model.path ?? searched ?? "path hidden";
  const sha = plan.model.sha256 ? ` · sha256 ${plan.model.sha256.slice(0, 12)}…` : "";
  return `${plan.model.name ?? where}${plan.model.name ? ` (${where})` : ""}${sha}`;
}

function grid(s) {
  const repeats =
    s.repeats === "auto"
      ? `repeats until ±${(s.repeat_target * 100).toFixed(1)}%`
      : `${s.repeats} repeats`;
  return `PP ${s.npp.join(",")} · TG ${s.ntg.join(",")} · B ${s.npl.join(",")} · ${repeats}`;
}

function load(plan) {
  if (plan.kind !== "serving") return grid(plan.settings);
  const s = plan.serve ?? {};
  const levels = s.slo ? `largest C meeting ${s.slo}` : `C ${(s.concurrency ?? [1, 2, 4, 8]).join(",")}`;
  return `serving · ${levels} · prompt ${s.prompt_tokens ?? 512} · output ${s.gen_tokens ?? 128}`;
}

function nodeLinks(entries) {
  if (entries.length === 0) return dash();
  return entries.map(({ node, state }) =>
    h(
      "span",
      { class: state.skipped ? "chip skipped" : "chip", title: state.skipped ?? "" },
      h("a", { href: curvesUrl(node) }, node),
      ` v${state.version}`,
    ),
  );
}

function planRow(plan, states) {
  const running = states.filter((s) => !s.state.skipped);
  const skipped = states.filter((s) => s.state.skipped);
  return h(
    "tr",
    { dataset: { plan: plan.name } },
    h("td", {}, plan.name, plan.enabled ? null : [" ", badge("retired", "stale")]),
    h("td", { class: "num" }, String(plan.version)),
    h("td", {}, selector(plan)),
    h("td", {}, model(plan)),
    h("td", {}, h("code", {}, plan.cron), " UTC"),
    h("td", {}, load(plan)),
    h("td", {}, nodeLinks(running)),
    h("td", {}, nodeLinks(skipped)),
    h("td", {}, timeElement(plan.created_at), plan.created_by ? ` by ${plan.created_by}` : null),
  );
}

async function main() {
  let plans;
  let nodes;
  try {
    [plans, nodes] = await Promise.all([api("/v1/plans"), api("/v1/nodes")]);
  } catch (error) {
    showError(statusBox, error);
    done("error");
    return;
  }
  if (plans.data.length === 0) {
    message(
      statusBox,
      "empty",
      "No plans yet. Save one with `fleetbench-registry plan apply NAME plan.toml`.",
    );
    done("empty");
    return;
  }
  const byPlan = new Map();
  for (const node of nodes.data) {
    for (const state of node.plans ?? []) {
      if (!byPlan.has(state.name)) byPlan.set(state.name, []);
      byPlan.get(state.name).push({ node: node.name, state });
    }
  }
  replace(
    table.querySelector("tbody"),
    plans.data.map((plan) => planRow(plan, byPlan.get(plan.name) ?? [])),
  );
  table.hidden = false;
  if (plans.paths_hidden) {
    message(
      statusBox,
      "info",
      "Model paths, binaries and server URLs are shown to a reader or admin token.",
      { askToken: true },
    );
  }
  done();
}

main();
