"""pytorch/examples' mnist/main.py as people run it, on synthetic images: a script that knows nothing of tuiwatch.

The structure, names and prints are the example's (train/test functions, Adadelta, StepLR, a log line every
``--log-interval`` batches); the model is smaller and the data random, so it runs in seconds on a CPU. Options
the example lacks, for tests: ``--fail-at`` (a bug at that batch), ``--exit-code``, ``--accumulate``,
``--amp`` (a GradScaler, as AMP scripts use it), ``--truth`` (every batch's loss, written as the script sees it).
"""

import argparse
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(8 * 6 * 6, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, device, train_loader, optimizer, epoch, scaler, truth):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        if batch_idx == args.fail_at:
            raise RuntimeError(f"a bug in the training script at batch {batch_idx}")
        data, target = data.to(device), target.to(device)
        output = model(data)
        loss = F.nll_loss(output, target) / args.accumulate
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        truth.append(loss.item())
        if (batch_idx + 1) % args.accumulate == 0:
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad()
        if batch_idx % args.log_interval == 0:
            seen, total = batch_idx * len(data), len(train_loader.dataset)
            share = 100.0 * batch_idx / len(train_loader)
            print(f"Train Epoch: {epoch} [{seen}/{total} ({share:.0f}%)]\tLoss: {loss.item():.6f}")


def test(model, device, test_loader):
    model.eval()
    test_loss = 0.0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    total = len(test_loader.dataset)
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{total} ({100.0 * correct / total:.0f}%)\n")


def synthetic(n, seed):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 16, 16, generator=g)
    labels = (images.mean(dim=(1, 2, 3)) * 40).long().clamp(-5, 4) + 5  # learnable from the pixels
    return torch.utils.data.TensorDataset(images, labels)


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example (synthetic)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=640)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--truth")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    train_loader = torch.utils.data.DataLoader(
        synthetic(args.train_size, 0), batch_size=args.batch_size, shuffle=True, num_workers=args.workers
    )
    test_loader = torch.utils.data.DataLoader(synthetic(512, 1), batch_size=args.test_batch_size)
    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    scaler = torch.amp.GradScaler("cpu") if args.amp else None
    truth: list[float] = []
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch, scaler, truth)
        test(model, device, test_loader)
        scheduler.step()
    if args.truth:
        with open(args.truth, "w") as f:
            json.dump(truth, f)
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
