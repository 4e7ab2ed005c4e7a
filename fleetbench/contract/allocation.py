"""What llama.cpp allocated for a sweep against what the KV-cache maths predicted.

A fit check is only as good as its prediction: every offline run carries the buffers
llama.cpp logged (`RunReport.buffers`), so the prediction is checked on every run, and a
node's fit can add the weights and scratch memory it measured instead of assuming the
file's size. Pure functions over a report, shared by the agent (which prints the check) and
the registry (which stores it)."""

from __future__ import annotations

from collections.abc import Iterable

from fleetbench.contract.bounds import MAX_MEMORY_BYTES
from fleetbench.contract.kv_cache import kv_cache_bytes
from fleetbench.contract.wire import AllocatedBuffer, RunReport

__all__ = ["allocated_bytes", "beside_kv_bytes", "kv_prediction_error_pct", "predicted_kv_bytes"]


def allocated_bytes(buffers: Iterable[AllocatedBuffer], kind: str) -> int | None:
    """The bytes of every buffer of `kind` (model, kv, compute, output) across devices, or
    None when llama.cpp logged none."""
    sizes = [b.bytes for b in buffers if b.kind == kind]
    return sum(sizes) if sizes else None


def beside_kv_bytes(buffers: Iterable[AllocatedBuffer]) -> int | None:
    """What the context needs besides its KV cache in the memory a node's fit is checked
    against, as measured: weights, compute scratch and outputs; None unless both the weights
    and the compute buffer were logged. That memory is a discrete GPU's where buffers went
    to one (CUDA0, ROCm0, Vulkan0: the host's buffers beside them, CPU_Mapped or CUDA_Host,
    are not in it), else the memory everything shares (a CPU's RAM, Apple's unified memory).
    Repacked weights (CPU_REPACK) count beside the mapped file they were copied from: both
    take memory."""
    buffers = list(buffers)
    on_device = [b for b in buffers if not _shared(b.device)]
    if on_device:
        buffers = on_device
    model, compute = allocated_bytes(buffers, "model"), allocated_bytes(buffers, "compute")
    if model is None or compute is None:
        return None
    return model + compute + (allocated_bytes(buffers, "output") or 0)


def _shared(device: str) -> bool:
    """Whether a buffer type lies in memory the whole node shares: the host's, or Apple's."""
    return device.startswith(("CPU", "Metal")) or device.endswith("_Host")


def predicted_kv_bytes(report: RunReport) -> int | None:
    """The KV cache the maths predicts for the context the run created (its n_ctx, as many
    sequences as its largest B, its cache types), or None when the numbers are missing or
    give more than any memory holds (architecture numbers within their bounds can)."""
    settings = report.settings
    batches = [p.b for p in report.points] + [f.b for f in report.failures]
    if settings.n_ctx is None or not batches:
        return None
    predicted = kv_cache_bytes(
        report.model,
        n_ctx=settings.n_ctx,
        n_seq=max(batches),
        n_ubatch=settings.n_ubatch or 512,
        cache_type_k=settings.cache_type_k or "f16",
        cache_type_v=settings.cache_type_v or "f16",
        unified=bool(settings.kv_unified),
        swa_full=bool(settings.swa_full),
        flash_attn=settings.flash_attn,
        build=report.engine.build_number,
    )
    return predicted if predicted is not None and predicted <= MAX_MEMORY_BYTES else None


def kv_prediction_error_pct(predicted: int | None, allocated: int | None) -> float | None:
    """How far the prediction is from the allocation, in % of the allocation (positive:
    the maths predicts more than llama.cpp allocated)."""
    if predicted is None or not allocated:
        return None
    return 100.0 * (predicted - allocated) / allocated
