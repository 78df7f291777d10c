"""PyTorch Geometric's batches: neither sequences nor mappings, they were not walked.

A ``Batch`` of graphs from PyG's DataLoader gave a step no batch shape, a batch
finiteness of null (a NaN in the node features was then "the model, or the
data"), no example rate, no class count, and a dump that kept the batch as its
text. pyg-team/pytorch_geometric's ``examples/mutag_gin.py`` under ``tuiwatch
run`` showed it (docs/integrations.md).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv, global_mean_pool

from tuiwatch import NonFiniteError, Watch
from tuiwatch.publisher.dumps import Dump, load_dump
from tuiwatch.publisher.measure import BatchInfo, batch_size

from ..helpers import records, watch_steps


def _graphs(count: int, *, edges_first: bool = False) -> list[Data]:
    """Chains of 3 to 7 nodes with 3 features each, labelled by the sign of their first node's first feature."""
    g = torch.Generator().manual_seed(0)
    graphs = []
    for i in range(count):
        n = 3 + i % 5
        x = torch.randn(n, 3, generator=g)
        edge_index = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
        y = torch.tensor([int(x[0, 0] > 0)])
        if edges_first:  # (Data's keywords are stored in its own order, x first: set one by one)
            data = Data()
            data.edge_index, data.x, data.y = edge_index, x, y
        else:
            data = Data(x=x, edge_index=edge_index, y=y)
        graphs.append(data)
    return graphs


class GraphClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = GCNConv(3, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return self.head(global_mean_pool(self.conv(x, edge_index).relu(), batch))  # type: ignore[no-any-return]


def test_a_batch_of_graphs_is_walked_and_a_nan_in_one_graph_is_named_the_datas_with_that_graph(run_root: Path):
    graphs = _graphs(40)
    graphs[29].x[1, 2] = math.nan  # graph 29: the eighth batch of 4, in order
    torch.manual_seed(0)
    model = GraphClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    with pytest.raises(NonFiniteError, match="boundary=batch"), watch:
        for data in watch.batches(DataLoader(graphs, batch_size=4)):
            loss = nn.functional.cross_entropy(model(data.x, data.edge_index, data.batch), data.y)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == list(range(8))
    for s in steps:
        members = graphs[4 * s["step"] : 4 * s["step"] + 4]
        nodes, edges = sum(d.num_nodes for d in members), sum(d.num_edges for d in members)
        assert s["batch_shape"] == {"x": [nodes, 3], "edge_index": [2, edges], "y": [4], "batch": [nodes], "ptr": [5]}
        assert s["batch_ids"] == list(range(4 * s["step"], 4 * s["step"] + 4))
        # Four graphs a step: the example rate counts graphs, not nodes (the first tensor's rows).
        assert s["examples_per_s"] * (s["data_wait_s"] + s["compute_s"]) == pytest.approx(4)
        assert s["tokens"] is None
        assert s["finite"]["batch"] is (s["step"] != 7)
    assert steps[0]["classes"] == 2  # the output's width, with a label a graph: loss-chance knows the chance level

    alert = next(r for r in records(watch.ledger_path, "alert") if r["rule"] == "nonfinite")  # type: ignore[arg-type]
    assert (alert["step"], alert["evidence"]["boundary"]) == (7, "batch")
    assert alert["evidence"]["nonfinite_sample_ids"] == [29]  # the graph whose node holds the NaN, by the batch vector
    dumped = load_dump(alert["evidence"]["dump"])
    assert isinstance(dumped, Dump)
    assert set(dumped.batch) == {"x", "edge_index", "y", "batch", "ptr"}  # the tensors, not the batch's text
    assert torch.isnan(dumped.batch["x"]).sum() == 1
    assert torch.equal(dumped.batch["y"], torch.cat([d.y for d in graphs[28:32]]))


def test_a_graph_batch_whose_first_tensor_is_its_edges_has_its_graph_count_and_no_tokens():
    # An edge_index first, (2, E) integers, read as a language model's (batch, time) token ids: size 2, tokens 2E.
    batch = Batch.from_data_list(_graphs(6, edges_first=True))
    info = BatchInfo(batch)
    assert next(iter(info.shape)) == "edge_index"
    assert (info.size, info.tokens, batch_size(batch)) == (6, None, 6)
    assert info.probe() == pytest.approx(float(batch.x.sum()), rel=1e-5)
    assert info.nbytes == sum(t.nbytes for t in batch.to_dict().values())


def test_one_graph_has_no_sample_count_and_a_neighbour_loaders_sample_counts_its_seed_nodes():
    graph = _graphs(1)[0]
    info = BatchInfo(graph)
    assert info.shape == {"x": [3, 3], "edge_index": [2, 2], "y": [1]}
    assert (info.seen, info.size, batch_size(graph)) == (True, None, None)  # not 3 (its nodes) nor 2 (its edges)
    # NeighborLoader's samples are one graph each with the seed nodes first and their count as batch_size.
    graph.batch_size = 2
    assert (BatchInfo(graph).size, batch_size(graph)) == (2, 2)


def test_a_heterogeneous_graph_is_read_by_node_and_edge_type():
    graph = HeteroData()
    graph["paper"].x = torch.randn(4, 3)
    graph["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
    info = BatchInfo(graph)
    assert info.shape == {"paper": {"x": [4, 3]}, "('paper', 'cites', 'paper')": {"edge_index": [2, 2]}}
    assert info.probe() == pytest.approx(float(graph["paper"].x.sum()), rel=1e-5)
    graph["paper"].x[2, 1] = math.nan
    assert math.isnan(BatchInfo(graph).probe())
