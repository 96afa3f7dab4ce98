"""One call of each cuda-gemm operator (qk, av, qk backward, av backward) on a problem of
bench/unfused_gpu.py, for Nsight Compute (run on the device after `tools/gpu/run.sh build`):

    ncu -k regex:gemm --section SpeedOfLight --section WarpStateStats \
        python3 tools/experiments/gemm_profile.py 2d-nat
"""
import math
import sys

import torch

sys.path.insert(0, "bench")
import fna  # noqa: E402
from unfused_gpu import AV, PROBLEMS, QK  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "2d-nat"
B, H, shape, D, ks = PROBLEMS[name]
rank = len(shape)
torch.manual_seed(0)
q, k, v = (torch.randn(B, *shape, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
attn = QK[rank](q, k, ks, backend="cuda-gemm").float().mul_(D ** -0.5).softmax(-1)
attn = attn.to(torch.bfloat16)
AV[rank](attn, v, ks, backend="cuda-gemm")
fna.na_qk_backward(torch.randn_like(attn), q, k, ks, backend="cuda-gemm")
fna.na_av_backward(torch.randn_like(q), attn, v, ks, backend="cuda-gemm")
torch.cuda.synchronize()
print(name, "W =", math.prod(ks))
