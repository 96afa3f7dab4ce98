"""bench/dense_bench.py on the CPU: the GPU timer, the device name and the plan are stood in for,
fna runs on its cpu backend and the peers on SDPA's math kernel, so what is checked is the script's
own work: each peer gets the same tensors in its layout ((B, H, N, D) copies for SDPA, views of
fna's [B, N, H, D] for FlashAttention 4) and its output is compared with fna's, a peer that fails
is reported and left out, forward and forward+backward are timed, and the table and JSON have a
column per peer."""
import json
import os
import sys
import types

import pytest

torch = pytest.importorskip("torch")
import fna  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import dense_bench  # noqa: E402


def _cpu_stand_ins(monkeypatch, fa4):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu stand-in")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    randn = torch.randn
    monkeypatch.setattr(torch, "randn",
                        lambda *a, device=None, generator=None, **k: randn(*a, **k))

    class Gen:
        def __init__(self, device=None):
            pass

        def manual_seed(self, s):
            torch.manual_seed(s)
            return self

    monkeypatch.setattr(torch, "Generator", Gen)
    for r in (1, 2, 3):
        f = getattr(fna, f"na{r}d")
        monkeypatch.setattr(fna, f"na{r}d", lambda q, k, v, ks, backend=None, tuning=None, f=f:
                            f(q, k, v, ks, backend="cpu"))
    monkeypatch.setattr(fna, "fused_plan", lambda *a, **k: {"config": "fwd-cfg",
                                                            "backward_config": "bwd-cfg"})
    calls = []

    def timed(fn, reps, warmup, *a, **k):
        calls.append(fn)
        fn()
        return (1.0, 1)

    monkeypatch.setattr(dense_bench, "timed", timed)
    from torch.nn.attention import SDPBackend
    math_sdpa = dense_bench.sdpa_call

    def sdpa(be, q, k, v):
        if be == SDPBackend.CUDNN_ATTENTION:
            raise RuntimeError("no cuDNN attention here")
        return math_sdpa(SDPBackend.MATH, q, k, v)

    monkeypatch.setattr(dense_bench, "sdpa_call", sdpa)
    if fa4:
        mod = types.ModuleType("flash_attn.cute")

        def flash_attn_func(q, k, v):  # FA4's layout: [B, N, H, D]; returns (out, lse)
            assert q.shape[2] < q.shape[1]  # heads third, tokens second
            o = math_sdpa(SDPBackend.MATH, q.transpose(1, 2), k.transpose(1, 2),
                          v.transpose(1, 2))
            return o.transpose(1, 2), None

        mod.flash_attn_func = flash_attn_func
        monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
        monkeypatch.setitem(sys.modules, "flash_attn.cute", mod)
    else:
        monkeypatch.setitem(sys.modules, "flash_attn", None)  # import fails
    return calls


@pytest.mark.parametrize("fa4", [False, True])
def test_dense_bench_peers_and_tables(monkeypatch, tmp_path, capsys, fa4):
    calls = _cpu_stand_ins(monkeypatch, fa4)
    monkeypatch.setattr(sys, "argv", ["dense_bench.py", "--dims", "16", "--shapes", "40/6x5",
                                      "--heads", "2", "--dtype", "bf16", "--out", str(tmp_path)])
    dense_bench.main()
    text = capsys.readouterr().out
    rows = json.load(open(tmp_path / "dense.json"))["rows"]
    peers = ["cudnn", "flash"] + (["fa4"] if fa4 else [])
    assert ("FlashAttention 4: not timed" in text) != fa4
    assert [r["shape"] for r in rows] == ["40", "6x5"]
    for r in rows:
        assert r["cudnn_error"] == "no cuDNN attention here" and "cudnn_fwd_ms" not in r
        for p in peers[1:]:
            # The same function on the same tensors: bf16 rounding apart.
            assert r[p + "_maxdiff"] < 0.05, (p, r)
            assert r[p + "_fwd_ms"] == r[p + "_fb_ms"] == 1.0
        assert r["fwd_config"] == "fwd-cfg"
    # fna and each working peer, forward and forward+backward, per problem.
    assert len(calls) == 2 * 2 * (1 + len(peers) - 1)
    header = next(line for line in text.splitlines() if line.startswith("| grid"))
    assert header.count("| x ") == 2 * len(peers)
