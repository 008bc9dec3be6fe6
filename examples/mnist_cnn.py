"""A CNN trained on MNIST-shaped data, written for a CUDA GPU.

This is the usual MNIST tutorial script, unmodified for Ascend: it asks for
`cuda:0`, moves model and batches with `.to(device)`, trains with SGD, saves a
checkpoint dict with `torch.save` and reloads it with `map_location='cuda'`.
The data are synthetic (nothing can be downloaded): 28x28 images whose class
decides a stroke pattern, plus noise, so the loss has something to learn.

    python examples/mnist_cnn.py                     # on a CUDA machine
    python -m ascend_patch examples/mnist_cnn.py     # anywhere, via ascend_patch
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(32 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_mnist(n, seed=0):
    """MNIST-shaped (n, 1, 28, 28) images; each class has its own fixed pattern."""
    templates = (torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234)) > 0.7).float()
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = templates[labels] + 1.0 * torch.randn(n, 1, 28, 28, generator=g)
    return TensorDataset((images - 0.1307) / 0.3081, labels)


def train_step(model, optimizer, data, target):
    optimizer.zero_grad()
    loss = F.nll_loss(model(data), target)
    loss.backward()
    optimizer.step()
    return loss


def train(model, device, loader, optimizer, epoch, log_interval):
    model.train()
    total = 0.0
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        loss = train_step(model, optimizer, data, target)
        total += loss.item()
        if batch_idx % log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\tLoss: {loss.item():.6f}")
    return total / len(loader)


def test(model, device, loader):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    n = len(loader.dataset)
    print(f"Test set: Average loss: {loss / n:.4f}, Accuracy: {correct}/{n} ({100.0 * correct / n:.0f}%)")
    return loss / n, correct / n


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST example (CUDA)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--train-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--save-model", default=os.path.join(tempfile.gettempdir(), "mnist_cnn.pt"))
    args = parser.parse_args()

    if not torch.cuda.is_available():
        raise SystemExit("This script needs a CUDA GPU.")
    torch.manual_seed(args.seed)
    device = torch.device("cuda:0")
    torch.backends.cudnn.benchmark = True

    train_loader = DataLoader(synthetic_mnist(args.train_size, seed=1), batch_size=args.batch_size,
                              shuffle=True, pin_memory=True, num_workers=0)
    test_loader = DataLoader(synthetic_mnist(512, seed=2), batch_size=256, pin_memory=True)

    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    losses = []
    for epoch in range(1, args.epochs + 1):
        losses.append(train(model, device, train_loader, optimizer, epoch, args.log_interval))
        test(model, device, test_loader)
    print("epoch losses: " + " ".join(f"{x:.4f}" for x in losses))

    torch.save({"epoch": args.epochs, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
               args.save_model)
    checkpoint = torch.load(args.save_model, map_location="cuda")
    restored = Net().to(device)
    restored.load_state_dict(checkpoint["model"])
    _, accuracy = test(restored, device, test_loader)
    print(f"reloaded checkpoint {args.save_model} (epoch {checkpoint['epoch']}): accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
