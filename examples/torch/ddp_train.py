"""DDP training of a small model on the ncclx backend.

    tools/ncclx-run -np 2 examples/torch/ddp_train.py [--backend ncclx|gloo] [--steps N]

Prints the loss every 10 steps on rank 0 and a checksum of the parameters at the end, so two
runs (ncclx and gloo) can be compared."""
import argparse

import torch
import torch.distributed as dist

import ncclx.torch  # noqa: F401  registers the "ncclx" backend


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="ncclx")
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02)
    gen = torch.Generator().manual_seed(1234 + rank)  # each rank its own shard of the data
    w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    for step in range(args.steps):
        x = torch.randn(64, 32, generator=gen)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ w_true)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print("step %3d loss %.4f" % (step, loss.item()), flush=True)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    if rank == 0:
        print("backend %s: parameter checksum %.10f" % (args.backend, checksum))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
