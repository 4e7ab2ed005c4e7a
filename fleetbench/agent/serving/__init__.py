"""Serving sweeps: what the server a team runs delivers, measured from the client's side as
users feel it. At each concurrency C, exactly C streaming completions are in flight (a
closed loop); every streamed token is timestamped, and each concurrency gives one point:
total output tokens/s, per-user decode speed, time to first token, inter-token and
end-to-end latency, and the errors by kind.

Rooms: `servers` (which server answers, its build, slots and context, whether it is busy),
`dialects` (llama-server's /completion and the OpenAI-compatible /v1/completions: the
request body and how a streamed event reads), `load` (the closed loop), `stats` (a point
from the requests' records: pure), `sweep` (the concurrencies in turn, failures as data),
`outputs` (a llama-server's output fingerprint on the reference text, a token at a time).
"""
