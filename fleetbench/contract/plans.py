"""Sweep plans: what a registry's admins tell the fleet to sweep, in one place, and what
each node says back about running them. Part of the contract (fleetbench.contract): the
registry validates a plan by the same rules the agents run it by.

A plan picks nodes (by name, or by a label selector), a model (by its sha256, with a path or
directories to search on the node), the sweep's settings and a schedule; a serving plan
(`kind = "serving"`) picks the server to measure on each node (`url`, one the node allows)
and its load (`serve`) instead of the engine's grid. Every change is a new version; the
registry keeps them all. A node pulls the plans that pick it (`NodePlans`,
conditional on its ETag), keeps the last it got on disk, and reports what it runs, skips and
when it runs next (`NodeStatus`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from fleetbench.contract.bounds import Int32, Moment, Name, Sha256, Text
from fleetbench.contract.serve_spec import ServerUrl, ServeSpec
from fleetbench.contract.sweep_spec import SCHEDULED_REPEATS, SweepSpec

__all__ = [
    "KINDS",
    "MAX_PLANS_PER_NODE",
    "REASON_LENGTH",
    "NodePlans",
    "NodeStatus",
    "PlanBody",
    "PlanKind",
    "PlanModel",
    "PlanState",
    "PlanVersion",
    "PlanVersions",
    "plan_selects",
]

Path = Annotated[Text, Field(min_length=1, max_length=1000)]
LabelText = Annotated[Text, Field(min_length=1, max_length=200)]
REASON_LENGTH = 500
MAX_PLANS_PER_NODE = 1000  # what one node pulls and reports, at most
Reason = Annotated[Text, Field(max_length=REASON_LENGTH)]
# Five crontab fields of the characters crontab takes; the agent's scheduler checks the
# rest (ranges, names) when it loads the plan, and skips a plan it cannot schedule, saying so.
_CRON = re.compile(r"^\s*[0-9A-Za-z*/,\-?]+(\s+[0-9A-Za-z*/,\-?]+){4}\s*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanModel(_Strict):
    """The model a plan sweeps, and where a node finds it: `path` (checked against `sha256`
    when both are given), or the first `.gguf` file in `search_dirs` whose sha256 matches.
    A serving plan's model is the one its server serves: `name` alone, as reports call it
    (and OpenAI-compatible servers are asked for)."""

    sha256: Sha256 | None = None
    path: Path | None = None
    search_dirs: list[Path] = Field(default_factory=list, max_length=16)
    name: Name | None = Field(default=None, description="display name [default: the file's]")

    @model_validator(mode="after")
    def _search_by_sha256(self) -> PlanModel:
        if self.search_dirs and self.sha256 is None:
            raise ValueError("search_dirs find the model by its sha256: give sha256 too")
        return self


_DEFAULT_SETTINGS = SweepSpec(repeats=SCHEDULED_REPEATS)
PlanKind = Literal["offline", "serving"]
KINDS: tuple[PlanKind, ...] = ("offline", "serving")
# The fields of one kind of plan, which a plan of the other kind is written without: a
# plan's stored body, and the ETag of what its nodes pull, never change with the other
# kind's defaults.
_FIELDS_OF: dict[str, tuple[str, ...]] = {
    "offline": ("settings", "engine", "binary", "binding_version"),
    "serving": ("url", "serve"),
}


class PlanBody(_Strict):
    """A plan as an admin writes it. `nodes` and `labels` select the nodes: a node named in
    `nodes`, or whose labels hold every `labels` pair; both empty: every node."""

    nodes: list[Name] = Field(default_factory=list, max_length=10_000)
    labels: dict[LabelText, LabelText] = Field(default_factory=dict, max_length=32)
    model: PlanModel
    cron: str = Field(max_length=200, description="crontab expression (UTC), e.g. '0 3 * * *'")
    kind: PlanKind = Field(
        default="offline",
        description="offline: the llama-batched-bench sweep of the engine; serving: a "
        "serving sweep of the server at `url` on each node",
    )
    engine: Annotated[Text, Field(max_length=100)] | None = Field(
        default=None, description="a runner's name [default: llama-cpp-python, or the binary's]"
    )
    binary: Path | None = Field(
        default=None, description="the node's llama-batched-bench, instead of in-process"
    )
    binding_version: Annotated[Text, Field(min_length=1, max_length=100)] | None = Field(
        default=None,
        description="a canary's build, in process: only nodes whose llama-cpp-python is this "
        "version run the plan (the others skip it, saying which they have); a binary plan "
        "names its build by its `binary`",
    )
    settings: SweepSpec = Field(
        default=_DEFAULT_SETTINGS,
        description="the sweep's grid and settings, by their names or llama.cpp's",
    )
    url: ServerUrl | None = Field(
        default=None,
        description="serving: the server each node measures (only where the node allows "
        "plans to load-test it: agent.plan_serve_urls)",
    )
    serve: ServeSpec | None = Field(
        default=None,
        description="serving: the load (concurrencies or an objective to search, prompt and "
        "output lengths, requests or seconds per concurrency)",
    )
    enabled: bool = True

    @model_validator(mode="after")
    def _kind_has_its_fields(self) -> PlanBody:
        if self.kind == "serving":
            if self.url is None or self.model.name is None:
                raise ValueError("a serving plan names its server's url and its model's name")
            offline = (
                self.engine,
                self.binary,
                self.binding_version,
                self.settings != _DEFAULT_SETTINGS,
            )
            if any(offline):
                raise ValueError(
                    "settings, engine, binary and binding_version are an offline plan's: a "
                    "serving plan's load is `serve`"
                )
            if self.model.path is not None or self.model.search_dirs:
                raise ValueError("a serving plan's model is its server's: give its name alone")
        else:
            if self.url is not None or self.serve is not None:
                raise ValueError('url and serve are a serving plan\'s (kind = "serving")')
            if self.model.path is None and not self.model.search_dirs:
                raise ValueError("give the model's path, or search_dirs to find it in by sha256")
            if self.binding_version is not None and (self.binary or self.engine):
                raise ValueError(
                    "binding_version picks the in-process engine's build: a plan running "
                    "a binary or another engine names its build by its binary"
                )
        return self

    @model_serializer(mode="wrap")
    def _without_the_other_kinds_fields(
        self, handler: SerializerFunctionWrapHandler
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("binding_version", 0) is None:  # plans written before it keep their body
            del data["binding_version"]
        for kind, fields in _FIELDS_OF.items():
            if kind != self.kind:
                for name in fields:
                    data.pop(name, None)
        return data

    def load(self) -> ServeSpec:
        """A serving plan's load (its `serve`, or the defaults)."""
        return self.serve or ServeSpec()

    @field_validator("settings", mode="before")
    @classmethod
    def _scheduled_repeats(cls, settings: object) -> object:
        if isinstance(settings, dict) and "repeats" not in settings:
            return {**settings, "repeats": SCHEDULED_REPEATS}
        return settings

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, cron: str) -> str:
        if not _CRON.match(cron):
            raise ValueError(f"{cron!r} is not a crontab expression of five fields")
        return cron.strip()


class PlanVersion(PlanBody):
    """One version of a plan, as stored."""

    name: Name
    version: Int32
    created_at: Moment
    created_by: Annotated[Text, Field(max_length=200)] | None = None


class PlanVersions(_Strict):
    data: list[PlanVersion]
    count: int
    paths_hidden: bool = Field(
        default=False,
        description="model paths, search directories, binaries and server URLs left out "
        "(null or empty): a reader or admin token shows them",
    )


def plan_selects(plan: PlanBody, node: str, labels: dict[str, object]) -> bool:
    """Whether the plan picks this node (see PlanBody)."""
    if not plan.nodes and not plan.labels:
        return True
    if node in plan.nodes:
        return True
    return bool(plan.labels) and all(labels.get(k) == v for k, v in plan.labels.items())


class NodePlans(_Strict):
    """What a node pulls: the enabled plans that pick it (their current versions) and, when
    an admin asked it to sweep now, when they asked."""

    node: str
    plans: list[PlanVersion] = Field(max_length=MAX_PLANS_PER_NODE)
    sweep_now: Moment | None = Field(
        default=None, description="an admin asked for every plan to run at the next poll"
    )


class PlanState(_Strict):
    """How one plan fares on a node."""

    name: Name
    version: Int32
    next_run_at: Moment | None = None
    last_run_at: Moment | None = None
    last_status: Literal["ok", "partial", "failed", "postponed"] | None = None
    skipped: Reason | None = Field(
        default=None,
        description="why the node does not run it (model missing, sha256 "
        "mismatch, not enough memory, ...); None: it runs it",
    )


class NodeStatus(_Strict):
    """What a node reports about its plans after each poll and each sweep."""

    plans: list[PlanState] = Field(default_factory=list, max_length=MAX_PLANS_PER_NODE)
    local_sweeps: Int32 = Field(default=0, description="[[sweep]] tables of its own agent.toml")
    next_run_at: Moment | None = Field(default=None, description="its next sweep of any kind")
    swept_now: Moment | None = Field(
        default=None, description="the sweep-now request (NodePlans.sweep_now) it has run"
    )
