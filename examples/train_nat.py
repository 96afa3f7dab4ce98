#!/usr/bin/env python3
"""Train a NAT / DiNAT classifier from fna.models for a few steps on synthetic data.

    python examples/train_nat.py --device cuda                       # NAT-Mini, 224x224, batch 32
    python examples/train_nat.py --device cpu --model nat_toy --img-size 96 --kernel-size 3

The data is one fixed random batch with random labels (so the loss should fall as the model
memorizes it); the point is the throughput of the whole training step (forward, backward,
AdamW): images/s is measured over the steps after --warmup, synchronizing the GPU.

--model: any factory of fna.models (nat_mini ... dinat_base) or nat_toy, a reduced NAT (embed dim
32, depths 1/1/2/1) that trains in seconds on a CPU. The windows must fit every level:
kernel_size tokens per side at the last level (img_size / 32), kernel_size * dilation for DiNAT;
224 fits every published config with kernel 7.
"""

import argparse
import time

import torch
import torch.nn.functional as F

import fna.models


def make_model(args):
    kw = dict(num_classes=args.num_classes, drop_path_rate=args.drop_path)
    if args.kernel_size is not None:
        kw["kernel_size"] = args.kernel_size
    if args.model == "nat_toy":
        kw.setdefault("kernel_size", 7)
        return fna.models.NAT(embed_dim=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8],
                              mlp_ratio=2, **kw)
    return getattr(fna.models, args.model)(**kw)


def main():
    names = ["nat_toy"] + [n for n in fna.models.CONFIGS]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="nat_mini", choices=names)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    choices=["cpu", "cuda"])
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--kernel-size", type=int, default=None,
                    help="override the config's kernel size (odd; must fit the last level)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--num-classes", type=int, default=100)
    ap.add_argument("--drop-path", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--amp", action="store_true", help="bfloat16 autocast (CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device visible")

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = make_model(args).to(device).train()
    n_params = sum(p.numel() for p in model.parameters())

    # No weight decay on biases, norms, layer-scale gains and the positional bias.
    skip = model.no_weight_decay_keywords()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or any(s in name for s in skip) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)

    g = torch.Generator().manual_seed(args.seed)
    images = torch.randn(args.batch_size, 3, args.img_size, args.img_size, generator=g).to(device)
    labels = torch.randint(0, args.num_classes, (args.batch_size,), generator=g).to(device)

    print(f"{args.model}: {n_params / 1e6:.2f}M parameters, {args.device}, "
          f"batch {args.batch_size} x 3 x {args.img_size} x {args.img_size}"
          + (", bf16 autocast" if args.amp else ""))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
            loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    for _ in range(args.warmup):
        step()
    sync()
    start = time.perf_counter()
    losses = [step() for _ in range(args.steps)]  # no host sync inside the timed loop
    sync()
    elapsed = time.perf_counter() - start
    for i, loss in enumerate(losses):
        print(f"step {i + 1}/{args.steps}  loss {loss.item():.4f}")
    if args.steps:
        print(f"{args.steps * args.batch_size / elapsed:.1f} images/s "
              f"({elapsed / args.steps * 1e3:.1f} ms/step over {args.steps} steps)")


if __name__ == "__main__":
    main()
