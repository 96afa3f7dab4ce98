"""Neighborhood attention as a FlexAttention ``mask_mod`` — the peer fna is compared against.

This is the peer's mask, written from docs/semantics.md section 1 in vectorized torch ops over flattened
token indices. gpu_bench.py checks FlexAttention's output against fna's on every problem it
times, so the comparison is of the same function.
"""
from __future__ import annotations

import torch


def _axis_member(xq, xk, L, K, d, s, causal):
    gq, gk = xq % d, xk % d
    i, j = xq // d, xk // d
    lg = (L - gq + d - 1) // d
    if causal:
        leader = torch.minimum((i // s) * s + s - 1, lg - 1)
        start = torch.clamp(leader - K + 1, min=0)
        end = torch.minimum(i + 1, lg)
    else:
        left = K // 2
        right = K - 1 - left
        leader = torch.minimum((i // s) * s + s // 2, lg - 1)
        start = torch.clamp(leader - left, min=0)
        start = start + torch.where(leader + right >= lg, lg - right - leader - 1, 0)
        end = start + K
    return (gq == gk) & (start <= j) & (j < end)


def na_mask_mod(shape, kernel, dilation, stride, causal):
    """mask_mod(b, h, q_idx, kv_idx) for NA over a grid of `shape` (row-major token order)."""
    rank = len(shape)

    def coords(idx):
        out = []
        for ax in reversed(range(rank)):
            out.append(idx % shape[ax])
            idx = idx // shape[ax]
        return out[::-1]

    def mask_mod(b, h, q_idx, kv_idx):
        cq, ck = coords(q_idx), coords(kv_idx)
        m = None
        for ax in range(rank):
            a = _axis_member(cq[ax], ck[ax], shape[ax], kernel[ax], dilation[ax], stride[ax],
                             causal[ax])
            m = a if m is None else (m & a)
        return m

    return mask_mod
