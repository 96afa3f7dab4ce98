"""The unfused operators on the GPU: cuda-gemm (tensor-core GEMMs over tiles, the paper's section
3.2) against cuda-naive (one thread per output element, section 3.1), each against its roofline;
and the paper's naive / GEMM / fused comparison of whole neighborhood attention.

    PYTHONPATH=python python3 bench/unfused_gpu.py [--problems nat-t,2d-nat,2d-large-k13] [--reps 7]

Per problem and operator (qk, qk with a relative positional bias added in the kernel and, for
comparison, gathered and added after it; av, and their backwards: na_qk_backward -> dQ, dK;
na_av_backward -> d attn, dV), bfloat16, the median GPU milliseconds of each backend and its
ratio to the roofline max(bytes / copy bandwidth, FLOPs / dense rate): bytes are one read of each
input and one write of each output (the attention tensor [B, *shape, H, W] included), FLOPs those
the operator needs (2 per multiply-add over the window: qk and av 2 N H W D, each backward twice
that), the copy bandwidth and cuDNN SDPA's dense self-attention rate at the same head dim measured
in the same run. Then na*d forward and forward + backward on each of the three backends
(cuda-naive and cuda-gemm compose qk, softmax and av over a float32 workspace; cuda-fused never
writes the attention weights), with TFLOP/s by docs/semantics.md's count.
"""

import argparse
import math
import sys

import torch

import fna
import fna._rpb  # noqa: F401  (the gathered-bias comparison row)
from fna._profiler_torch import gpu_time

# name: (B, H, shape, D, kernel)
PROBLEMS = {
    "nat-t": (32, 3, (56, 56), 32, (7, 7)),
    "2d-nat": (8, 8, (128, 128), 64, (13, 13)),
    "2d-large-k13": (1, 16, (256, 256), 128, (13, 13)),  # 2d-large's shape, a 13x13 window
}
NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
QK = {1: fna.na1d_qk, 2: fna.na2d_qk, 3: fna.na3d_qk}
AV = {1: fna.na1d_av, 2: fna.na2d_av, 3: fna.na3d_av}


def ms_of(fn, reps):
    return gpu_time(fn, reps, 2, 30.0, 2.0, head_start=True)[0]


def copy_bandwidth(mib=2048, reps=10):
    a = torch.randn(mib * 2**20 // 2, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = ms_of(lambda: b.copy_(a), reps)
    bw = 2.0 * a.numel() * a.element_size() / (ms * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return bw


def dense_rate(D, reps):
    """cuDNN SDPA's self-attention forward FLOP/s at head dim D (N = 16384, 16 heads, bf16)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    N, H = 16384, 16
    q = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ms = ms_of(lambda: F.scaled_dot_product_attention(q, q, q), reps)
    return 4.0 * N * N * H * D / (ms * 1e-3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--backends", default="cuda-naive,cuda-gemm")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    bw = copy_bandwidth()
    print(f"{dev}; torch {torch.__version__}; fna {fna.__version__}; bf16; medians of "
          f"{args.reps} calls (GPU time)")
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s")
    rates = {}
    backends = args.backends.split(",")
    rows, attn_rows = [], []
    for name in args.problems.split(","):
        B, H, shape, D, ks = PROBLEMS[name]
        rank = len(shape)
        if D not in rates:
            rates[D] = dense_rate(D, args.reps)
            print(f"cuDNN dense forward rate at D={D}: {rates[D] / 1e12:.0f} TFLOP/s")
        q, k, v = (torch.randn(B, *shape, H, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        W = math.prod(ks)
        tokens = B * math.prod(shape) * H
        e = 2  # bytes per element
        qkv = tokens * D * e
        att = tokens * W * e
        attn = QK[rank](q, k, ks).float().mul_(D ** -0.5).softmax(-1).to(torch.bfloat16)
        d_attn = torch.randn_like(attn)
        d_out = torch.randn_like(q)
        table = torch.randn(H, *(2 * x - 1 for x in ks), device="cuda")
        sp = (ks, (1,) * rank, (1,) * rank, (False,) * rank)

        def gathered(b):  # the bias gathered and added after the qk kernel (before QKArgs::rpb)
            return fna._rpb.add_to_logits(QK[rank](q, k, ks, backend=b), table, sp).to(q.dtype)
        ops = {
            # op: (callable(backend), bytes, flops)
            "qk": (lambda b: QK[rank](q, k, ks, backend=b), 2 * qkv + att, 2.0 * tokens * W * D),
            "qk + rpb": (lambda b: QK[rank](q, k, ks, backend=b, rpb=table), 2 * qkv + att,
                         2.0 * tokens * W * D),
            "qk + rpb gathered": (gathered, 2 * qkv + att, 2.0 * tokens * W * D),
            "av": (lambda b: AV[rank](attn, v, ks, backend=b), att + 2 * qkv,
                   2.0 * tokens * W * D),
            "qk backward": (lambda b: fna.na_qk_backward(d_attn, q, k, ks, backend=b),
                            att + 4 * qkv, 4.0 * tokens * W * D),
            "av backward": (lambda b: fna.na_av_backward(d_out, attn, v, ks, backend=b),
                            2 * att + 3 * qkv, 4.0 * tokens * W * D),
        }
        for op, (fn, nbytes, flops) in ops.items():
            roof = max(nbytes / bw, flops / rates[D]) * 1e3
            times = {}
            for b in backends:
                times[b] = ms_of(lambda b=b: fn(b), args.reps)
            rows.append((name, op, roof, times))
        # Whole attention: naive / GEMM / fused.
        na_flops = 4.0 * tokens * W * D  # forward: QK^T and PV over the window
        for b in ("cuda-naive", "cuda-gemm", "cuda-fused"):
            fwd = ms_of(lambda b=b: NA[rank](q, k, v, ks, backend=b), args.reps)
            qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

            def fb(b=b):
                out = NA[rank](qg, kg, vg, ks, backend=b)
                out.backward(d_out)
            fwdbwd = ms_of(fb, args.reps)
            attn_rows.append((name, b, fwd, fwdbwd, na_flops / (fwd * 1e-3) / 1e12,
                              3.5 * na_flops / (fwdbwd * 1e-3) / 1e12))
        del q, k, v, attn, d_attn, d_out
        torch.cuda.empty_cache()

    print("\n| problem | op | roofline ms | " +
          " | ".join(f"{b} ms | {b} / roofline" for b in backends) + " | gemm speedup |")
    print("| --- | --- | --- | " + " | ".join("--- | ---" for _ in backends) + " | --- |")
    for name, op, roof, times in rows:
        cells = " | ".join(f"{times[b]:.3f} | {times[b] / roof:.2f}x" for b in backends)
        sp = (f"{times['cuda-naive'] / times['cuda-gemm']:.1f}x"
              if "cuda-naive" in times and "cuda-gemm" in times else "-")
        print(f"| {name} | {op} | {roof:.3f} | {cells} | {sp} |")
    print("\n| problem | backend | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, b, f, fb, tf, tfb in attn_rows:
        print(f"| {name} | {b} | {f:.3f} | {fb:.3f} | {tf:.1f} | {tfb:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
