"""pytorch/examples' time_sequence_prediction/train.py as people run it: LBFGS with a closure, no DataLoader.

The structure, names and prints are the example's (two LSTMCells in double precision, ``optimizer.step(closure)``
whose closure zeroes, forwards, prints and backpropagates, a prediction under ``no_grad`` after each step); the
sine waves are made in memory (the example's generate_sine_wave.py, smaller) and the plots are left out, so it
runs in seconds on a CPU. An option the example lacks, for tests: ``--truth`` (each step's first closure loss and
the gradient norm it left, as the script sees them).
"""

import argparse
import json

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

HIDDEN = 12


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, HIDDEN)
        self.lstm2 = nn.LSTMCell(HIDDEN, HIDDEN)
        self.linear = nn.Linear(HIDDEN, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = torch.zeros(input.size(0), HIDDEN, dtype=torch.double)
        c_t = torch.zeros(input.size(0), HIDDEN, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), HIDDEN, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), HIDDEN, dtype=torch.double)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):  # if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def sine_waves(n=12, length=60, period=20):
    np.random.seed(2)
    x = np.empty((n, length), "int64")
    x[:] = np.array(range(length)) + np.random.randint(-4 * period, 4 * period, n).reshape(n, 1)
    return np.sin(x / 1.0 / period).astype("float64")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3, help="steps to run")
    parser.add_argument("--truth", default=None)
    opt = parser.parse_args()
    # set random seed to 0
    np.random.seed(0)
    torch.manual_seed(0)
    data = sine_waves()
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    test_input = torch.from_numpy(data[:3, :-1])
    test_target = torch.from_numpy(data[:3, 1:])
    # build the model
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    # use LBFGS as optimizer since we can load the whole data to train
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=5)
    truth: list[list[float]] = []
    # begin to train
    for i in range(opt.steps):
        print("STEP: ", i)
        calls: list[float] = []

        def closure(calls=calls):
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print("loss:", loss.item())
            loss.backward()
            if not calls:
                norm = torch.cat([p.grad.reshape(-1) for p in seq.parameters() if p.grad is not None]).norm().item()
                truth.append([loss.item(), norm])
            calls.append(loss.item())
            return loss

        optimizer.step(closure)
        # begin to predict, no need to track gradient here
        with torch.no_grad():
            future = 20
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            print("test loss:", loss.item())
    if opt.truth:
        with open(opt.truth, "w") as f:
            json.dump(truth, f)
