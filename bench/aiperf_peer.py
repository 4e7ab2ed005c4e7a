"""The peer bench/serving_compare.py measures fleetbench's load generator against: AIPerf
(PyPI `aiperf`), in a virtual environment of its own, with a Hugging Face tokenizer made from
the GGUF; its command line as close to fleetbench's closed loop as its options go, and its
summary export read back."""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.serving_clients import OFFLINE, Child, Placement, Run, Workload, run_child, with_cpu

__all__ = ["PEER", "Peer", "ensure_tokenizer", "peer_command", "peer_version", "run_peer"]

PEER = "aiperf"
# AIPerf 0.13 in Hugging Face's offline mode looks a tokenizer up as a hub repository only
# (snapshot_download), which a local directory is not (HFValidationError). Online, it takes
# an absolute path as local and never asks the hub; the hub's address is pointed at a closed
# loopback port all the same, so that anything that did try would fail at once, never fetch.
PEER_ENV = {
    "HF_ENDPOINT": "http://127.0.0.1:9",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_ETAG_TIMEOUT": "1",
    "HF_HUB_DOWNLOAD_TIMEOUT": "1",
}

# The peer's transformers reads a GGUF's metadata through a reader that imports torch, for
# tensors a tokenizer never needs: the metadata is read here with the gguf package instead,
# and transformers' own GGUF tokenizer conversion does the rest (the result tokenizes as
# llama.cpp does: checked on Gemma 3 against llama-cpp-python's tokenizer).
_MAKE_TOKENIZER = """
import os, sys, types
import gguf

def read_gguf_metadata(path, string_arrays=()):
    reader = gguf.GGUFReader(path)
    metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return metadata, tuple(t.name for t in reader.tensors)

reader = types.ModuleType("transformers.integrations.gguf.reader")
reader.read_gguf_metadata = read_gguf_metadata
sys.modules[reader.__name__] = reader
from transformers import GemmaTokenizer, LlamaTokenizer

model_file, out_dir = os.path.abspath(sys.argv[1]), sys.argv[2]
arch = read_gguf_metadata(model_file)[0]["general.architecture"]
cls = GemmaTokenizer if arch.startswith("gemma") else LlamaTokenizer
tokenizer = cls.from_pretrained(os.path.dirname(model_file), gguf_file=os.path.basename(model_file))
tokenizer.save_pretrained(out_dir)
print(type(tokenizer).__name__, len(tokenizer))
"""


@dataclass(frozen=True)
class Peer:
    venv: Path
    tokenizer: Path
    request_rate: float | None = None  # None: AIPerf's plain closed loop


def peer_command(peer: Peer, url: str, model: str, load: Workload, artifacts: Path) -> list[str]:
    """AIPerf's closed loop as close to fleetbench's as its options go: the OpenAI
    completions endpoint streamed, synthetic prompts of exactly `prompt_tokens` tokens (by the
    model's tokenizer), `gen_tokens` asked for with EOS ignored, greedy, no prompt cache,
    output lengths from the server's usage, `concurrency` warm-up requests; no server
    metrics scraping, no GPU telemetry, no UI. With a request rate, AIPerf's scheduler
    starts requests on a clock of that rate (still never more than C in flight) instead of
    polling without pause for a free slot, which keeps one core busy the whole run."""
    extra = {"ignore_eos": True, "temperature": 0, "cache_prompt": False}
    command = [
        str(peer.venv / "bin" / "aiperf"), "profile",
        "--model", model, "--tokenizer", str(peer.tokenizer),
        "--url", url, "--endpoint-type", "completions", "--streaming",
        "--concurrency", str(load.concurrency), "--request-count", str(load.requests),
        "--warmup-request-count", str(load.concurrency),
        "--isl", str(load.prompt_tokens), "--isl-stddev", "0",
        "--osl", str(load.gen_tokens), "--osl-stddev", "0",
        "--extra-inputs", json.dumps(extra), "--use-server-token-count",
        "--random-seed", "0",
        "--no-server-metrics", "--no-gpu-telemetry", "--ui-type", "none",
        "--artifact-dir", str(artifacts),
    ]  # fmt: skip
    if peer.request_rate is not None:
        rate = f"{peer.request_rate:g}"
        command += ["--request-rate", rate, "--arrival-pattern", "constant"]
    return command


def run_peer(
    peer: Peer, url: str, model: str, load: Workload, placement: Placement, timeout_s: float
) -> Run:
    with tempfile.TemporaryDirectory(prefix="aiperf-") as scratch:
        artifacts = Path(scratch)
        command = placement.pinned(peer_command(peer, url, model, load, artifacts))
        env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
        child = run_child(command, {**env, **PEER_ENV}, timeout_s)
        summary = _peer_summary(artifacts, child)
    figures = {
        "total_tps": _metric(summary, "output_token_throughput", "avg"),
        "per_user_tps_p50": _metric(summary, "output_token_throughput_per_user", "p50"),
        "ttft_ms_p50": _metric(summary, "time_to_first_token", "p50"),
        "ttft_ms_p90": _metric(summary, "time_to_first_token", "p90"),
        "itl_ms_p50": _metric(summary, "inter_token_latency", "p50"),
        "completed": _metric(summary, "request_count", "avg"),
        "output_tokens_mean": _metric(summary, "output_sequence_length", "avg"),
        "input_tokens_mean": _metric(summary, "usage_prompt_tokens", "avg"),
        "measured_s": _metric(summary, "benchmark_duration", "avg"),
    }
    if figures["completed"] != load.requests:
        # Seen with AIPerf 0.13 short of CPU: its summary is computed before its record
        # processors have handed in every request (the server answered them all), so its
        # throughput counts only those tokens. Kept, as the peer reports it, and flagged.
        print(
            f"  warning: AIPerf's summary counts {figures['completed']:.0f} of the"
            f" {load.requests} requests it sent",
            flush=True,
        )
    return Run(PEER, placement.name, with_cpu(figures, child, load))


def _peer_summary(artifacts: Path, child: Child) -> dict[str, Any]:
    """AIPerf's summary of the profiling phase (the warm-up's is apart, under
    "warmup_metrics")."""
    path = artifacts / "profile_export_aiperf.json"
    if not path.exists():
        raise SystemExit(f"AIPerf wrote no {path.name}:\n{child.stdout[-3000:]}")
    summary: dict[str, Any] = json.loads(path.read_text())
    return summary


def _metric(summary: dict[str, Any], tag: str, stat: str) -> float:
    """A metric of AIPerf's summary export, in its display unit (ms, tokens/s); NaN when
    absent. Older exports keep the metrics at the top level, newer ones under "metrics"."""
    metrics = summary.get("metrics", summary)
    entry = metrics.get(tag) if isinstance(metrics, dict) else None
    value = entry.get(stat) if isinstance(entry, dict) else None
    return float(value) if isinstance(value, int | float) else math.nan


def peer_version(peer_venv: Path) -> str:
    python = peer_venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{peer_venv} is no virtual environment (no bin/python): see --help")
    found = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        raise SystemExit(f"AIPerf is not installed in {peer_venv}: pip install aiperf")
    return found.stdout.strip()


def ensure_tokenizer(peer_venv: Path, model_file: Path, tokenizer: Path) -> None:
    """The model's tokenizer as a Hugging Face directory, made once from the GGUF."""
    if (tokenizer / "tokenizer.json").exists():
        return
    print(f"making the tokenizer {tokenizer} from {model_file} (once)", flush=True)
    made = subprocess.run(
        [str(peer_venv / "bin" / "python"), "-c", _MAKE_TOKENIZER, str(model_file), str(tokenizer)],
        env={**os.environ, **OFFLINE},
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        raise SystemExit(f"could not make the tokenizer:\n{made.stderr[-3000:]}")
