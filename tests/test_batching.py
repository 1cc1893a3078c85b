from collections import UserDict, namedtuple

import numpy as np
import pytest
import torch

from tropt.batching import batch_size, split_batch, split_sizes, to_device
from tropt.errors import TroptError


def _cat(parts, key=None):
    return torch.cat([p if key is None else p[key] for p in parts])


def test_tensor_even_and_uneven():
    x = torch.arange(10)
    parts = split_batch(x, 4)
    assert [len(p) for p in parts] == [3, 3, 2, 2] == split_sizes(10, 4)
    assert torch.equal(torch.cat(parts), x)


def test_tuple_list_namedtuple():
    x, y = torch.randn(7, 3), torch.arange(7)
    for batch in ((x, y), [x, y]):
        parts = split_batch(batch, 3)
        assert all(type(p) is type(batch) for p in parts)
        assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)
    Pair = namedtuple("Pair", "x y")
    parts = split_batch(Pair(x, y), 2)
    assert isinstance(parts[0], Pair) and parts[0].x.shape == (4, 3) and parts[1].y.tolist() == [4, 5, 6]


class BatchEncodingLike(UserDict):
    """Mapping type like Hugging Face's BatchEncoding (a UserDict subclass)."""

    def to(self, device):
        return self


def test_dict_and_mapping_nested_with_metadata():
    batch = BatchEncodingLike({
        "input_ids": torch.arange(12).reshape(6, 2),
        "extra": {"mask": torch.ones(6, 2), "lengths": [1, 2, 3, 4, 5, 6]},
        "ids": ["a", "b", "c", "d", "e", "f"],
        "temperature": 0.5,
        "scale": torch.tensor(2.0),
    })
    parts = split_batch(batch, 4)
    assert all(isinstance(p, BatchEncodingLike) for p in parts)
    assert [batch_size(p) for p in parts] == [2, 2, 1, 1]
    assert parts[2]["ids"] == ["e"] and parts[3]["extra"]["lengths"] == [6]
    assert all(p["temperature"] == 0.5 and p["scale"].item() == 2.0 for p in parts)
    assert torch.equal(_cat([p["input_ids"] for p in parts]), batch["input_ids"])


def test_explicit_sizes_and_numpy():
    x = np.arange(8)
    parts = split_batch({"x": x}, sizes=[5, 1, 2])
    assert [p["x"].tolist() for p in parts] == [[0, 1, 2, 3, 4], [5], [6, 7]]
    with pytest.raises(TroptError, match="sum to 8"):
        split_batch(x, sizes=[4, 3])


def test_bad_batches():
    with pytest.raises(TroptError, match="cannot be split into 5"):
        split_batch(torch.arange(3), 5)
    with pytest.raises(TroptError, match="disagree on the batch dimension"):
        batch_size((torch.zeros(4, 2), torch.zeros(5)))
    with pytest.raises(TroptError, match="holds no tensor"):
        batch_size({"a": 1.0})


def test_to_device_keeps_structure():
    Pair = namedtuple("Pair", "x y")
    batch = {"p": Pair(torch.ones(2), [torch.zeros(2), "meta"]), "n": 3}
    moved = to_device(batch, "cpu")
    assert isinstance(moved["p"], Pair) and moved["p"].y[1] == "meta" and moved["n"] == 3
    assert moved["p"].x.device.type == "cpu"
