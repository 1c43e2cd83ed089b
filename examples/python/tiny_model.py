"""The model the producer and the consumer examples share: a small MLP whose
weights both sides can compute from the same seed, so that the consumer can
check, bit for bit, what it received.

Version 1 is the seeded model; each later version is one "training step"
that adds STEP to every parameter (in place, on the producer's device)."""
import torch

PREFIX = "tiny/"  # the model's name in the registry: its tensors are tiny/0.weight, ...
STEP = 0.5


def make(device="cpu"):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)


def train_step(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(STEP)


def expected_state_dict(version):
    """What every tensor holds at `version` (computed on the CPU: the same IEEE
    additions as the producer's, so the values are equal bit for bit)."""
    model = make("cpu")
    for _ in range(version - 1):
        train_step(model)
    return model.state_dict()


def default_device():
    return "cuda" if torch.cuda.is_available() else "cpu"
