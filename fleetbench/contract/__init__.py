"""The contract agent and registry share, owned by neither: the report a node sends
(wire), the registry's answers agents read (answers), the sweep plans the registry hands
out (plans) and the sweep settings they carry (sweep_spec), the bounds of every value
(bounds) and the KV-cache maths both sides check fits with (kv_cache). Imports nothing but
pydantic, so either side can be installed without the other."""
