"""fleetbench: batching curves of LLM inference measured on every node of a fleet, and a
registry that answers placement questions from them.

- fleetbench.contract: what agent and registry share (wire format, answers, KV-cache
  maths); imports nothing but pydantic.
- fleetbench.agent: the node's side (`pip install fleetbench[agent]`, `[llama]` for the
  in-process engine).
- fleetbench.registry and fleetbench.migrations: the central side (`fleetbench[registry]`).
"""
