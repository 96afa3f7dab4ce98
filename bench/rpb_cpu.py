"""Relative positional bias on the CPU: the cpu backend's biased attention (the bias added in its
tile kernels) against the same call without a bias and against the unfused composition that the
CUDA backends run (na*d_qk, gathered bias, softmax, na*d_av; fna._rpb.attention on the cpu
backend's unfused operators), forward and forward + backward, in one process (the two fused calls in alternating rounds).

    PYTHONPATH=python python3 bench/rpb_cpu.py [--repeats 7] [--threads 2] [--problems nat-t,...]

Before timing, each problem's biased output and gradients are checked against the composition's
(an error, not a timing, when they differ). Prints one table row per (problem, mode): the median
milliseconds of each variant over the rounds and the two ratios.
"""

import argparse
import statistics
import sys
import time

import torch

import fna
from fna import _rpb

# name: (batch, spatial shape, heads, head dim, kernel, dilation)
PROBLEMS = {
    "nat-t": (2, (56, 56), 2, 32, (7, 7), (1, 1)),       # NAT-Tiny, first level
    "dinat-t": (2, (28, 28), 4, 32, (7, 7), (4, 4)),     # DiNAT-Tiny, a dilated second level
    "13x13": (1, (64, 64), 4, 64, (13, 13), (1, 1)),     # a large window
    "tiny": (1, (12, 10), 2, 8, (5, 3), (1, 2)),         # the tests' size
}


def tensors(problem, seed):
    B, shape, H, D, ks, _ = problem
    g = torch.Generator().manual_seed(seed)
    x = [torch.randn(B, *shape, H, D, generator=g) for _ in range(3)]
    rpb = torch.randn(H, *(2 * k - 1 for k in ks), generator=g)
    return x, rpb


def variants(problem):
    """name -> f(q, k, v, rpb) returning the output."""
    _, shape, _, D, ks, dil = problem
    na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
    kw = dict(dilation=dil, backend="cpu")
    sp = (list(ks), [1] * len(ks), list(dil), [False] * len(ks))
    scale = D ** -0.5
    return {
        "no bias": lambda q, k, v, rpb: na(q, k, v, ks, **kw),
        "rpb (cpu kernels)": lambda q, k, v, rpb: na(q, k, v, ks, rpb=rpb, **kw),
        "rpb (composition)": lambda q, k, v, rpb: _rpb.attention(q, k, v, rpb, sp, scale, None,
                                                                 None, "cpu")[0],
    }


def check(problem, fns):
    """The kernels' biased output and gradients against the composition's."""
    (q, k, v), rpb = tensors(problem, 1)
    results = []
    for name in ("rpb (cpu kernels)", "rpb (composition)"):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, rpb)]
        out = fns[name](*leaves)
        out.square().sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves])
    for what, a, b in zip(("output", "dq", "dk", "dv", "d_rpb"), *results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m: f"{what}: {m}")


def time_once(fn, leaves, backward):
    t0 = time.perf_counter()
    out = fn(*leaves)
    if backward:
        out.sum().backward()
    return (time.perf_counter() - t0) * 1e3


def run(names, repeats, out=sys.stdout):
    rows = []
    for pname in names:
        problem = PROBLEMS[pname]
        fns = variants(problem)
        check(problem, fns)
        (q, k, v), rpb = tensors(problem, 2)
        for backward in (False, True):
            times = {n: [] for n in fns}
            leaves = [t.clone().requires_grad_(backward) for t in (q, k, v, rpb)]
            # Rounds of the two fused calls alternating, then the composition's own rounds: its
            # attention tensors (tens of MB) evict the caches, which slowed whichever call ran
            # after it.
            for group in (("no bias", "rpb (cpu kernels)"), ("rpb (composition)",)):
                for n in group:  # warm-up
                    time_once(fns[n], leaves, backward)
                for _ in range(repeats):
                    for n in group:
                        for t in leaves:
                            t.grad = None
                        times[n].append(time_once(fns[n], leaves, backward))
            med = {n: statistics.median(ts) for n, ts in times.items()}
            rows.append((pname, "fwd+bwd" if backward else "fwd", med))
    print("| problem | mode | no bias (ms) | rpb, cpu kernels (ms) | rpb, composition (ms) | "
          "kernels / no bias | composition / kernels |", file=out)
    print("| --- | --- | --- | --- | --- | --- | --- |", file=out)
    for pname, mode, med in rows:
        a, b, c = med["no bias"], med["rpb (cpu kernels)"], med["rpb (composition)"]
        print(f"| {pname} | {mode} | {a:.2f} | {b:.2f} | {c:.2f} | {b / a:.3f} | {c / b:.2f} |",
              file=out)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="fna and torch threads (0: default)")
    ap.add_argument("--problems", default="nat-t,dinat-t,13x13",
                    help=f"comma-separated, of {', '.join(PROBLEMS)}")
    args = ap.parse_args(argv)
    names = [p for p in args.problems.split(",") if p]
    for p in names:
        if p not in PROBLEMS:
            ap.error(f"--problems: {p!r} is not one of {', '.join(PROBLEMS)}")
    if args.threads:
        fna.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    print(f"fna {fna.__version__}, torch {torch.__version__}, {fna.get_num_threads()} fna "
          f"threads, {torch.get_num_threads()} torch threads, {args.repeats} rounds")
    run(names, args.repeats)


if __name__ == "__main__":
    main()
