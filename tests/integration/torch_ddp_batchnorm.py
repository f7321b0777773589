"""PyTorch's side of test_distributed_batchnorm_torch.py: the batchnorm net
and one rank of torch.distributed DDP training it on the CPU with Gloo.

    python torch_ddp_batchnorm.py MODE RANK WORLD STORE INIT DATA OUT

MODE broadcast is DDP(broadcast_buffers=True), local DDP(broadcast_buffers=
False). STORE is the file of the job's torch.distributed FileStore, INIT the
module's state_dict (safetensors) every rank starts from, DATA an .npz of
each step's uint8 NHWC images and labels per rank (images_S_R, labels_S_R),
OUT the safetensors file this rank writes: its state_dict after the steps
(buffers as DDP's next forward sees them, see below) and its loss per step.
"""
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

SCALE = 0.00392156862745098  # 1/255: the service's to_dtype
LR = 0.2
MOMENTUM = 0.9


class Net(nn.Module):
    """The service's model.spec SPEC below: conv, batchnorm, relu, global
    average pool, linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(6)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.relu(self.bn1(self.conv1(x))).mean((2, 3)), 1))


SPEC = {"input": [3, 8, 8], "classes": 5, "layers": [
    {"type": "conv2d", "name": "conv1", "out": 6, "k": 3, "pad": 1, "bias": False},
    {"type": "batchnorm2d", "name": "bn1"}, {"type": "relu", "name": "relu"},
    {"type": "global_avgpool", "name": "avgpool"}, {"type": "flatten", "name": "flatten"},
    {"type": "linear", "name": "fc", "out": 5}]}


def as_input(images):
    """What to_dtype makes of a uint8 NHWC batch: float32(x) * float32(scale), NCHW."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() * torch.tensor(SCALE, dtype=torch.float32)


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def main(mode, rank, world, store, init, data, out):
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = Net()
    model.load_state_dict(load_file(init))
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=mode == "broadcast")
    opt = sgd(ddp.parameters())
    batches = np.load(data)
    steps = len([k for k in batches.files if k.startswith("images_") and k.endswith(f"_{rank}")])
    losses = []
    for s in range(steps):
        x = as_input(batches[f"images_{s}_{rank}"])
        y = torch.from_numpy(batches[f"labels_{s}_{rank}"]).long()
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # With broadcast_buffers DDP copies rank 0's buffers to every rank at the
    # start of each forward: one more forward, in eval mode and without
    # gradients (batchnorm then leaves its buffers as they are), makes that
    # copy, so the state below is what every rank trains on from here.
    ddp.eval()
    with torch.no_grad():
        ddp(as_input(batches[f"images_0_{rank}"]))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    state["loss"] = torch.tensor(losses, dtype=torch.float64)
    save_file(state, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    m, r, w, st, ini, d, o = sys.argv[1:8]
    main(m, int(r), int(w), st, ini, d, o)
