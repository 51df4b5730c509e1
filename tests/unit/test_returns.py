"""ember.run's return value crosses the process boundary as msgpack: arrays and tensors keep
their dtype, shape and values; anything that would need pickle is one error naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.worker.returns import UnencodableValue, decode, encode


def test_numbers_strings_lists_dicts_arrays_and_tensors_come_back_as_they_were() -> None:
    value = {
        "step": 7,
        "loss": 0.25,
        "name": "run",
        "raw": b"\x00\x01",
        "nothing": None,
        "pair": (1, "two"),
        3: True,
        "array": np.arange(6, dtype=np.int16).reshape(2, 3),
        "scalar": np.float32(1.5),
        "weight": torch.linspace(0, 1, 12, dtype=torch.bfloat16).reshape(3, 4),
        "empty": torch.empty(0, 5),
        "state": torch.nn.Linear(2, 1).state_dict(),
    }
    back = decode(encode(value))
    assert back["pair"] == [1, "two"] and back[3] is True and back["scalar"] == 1.5
    assert back["raw"] == b"\x00\x01" and back["nothing"] is None
    assert back["array"].dtype == np.int16 and (back["array"] == value["array"]).all()
    assert back["weight"].dtype == torch.bfloat16 and torch.equal(back["weight"], value["weight"])
    assert back["empty"].shape == (0, 5)
    assert torch.equal(back["state"]["weight"], value["state"]["weight"])


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"model": torch.nn.Linear(2, 1)}, "torch.nn.modules.linear.Linear"),
        ([{1, 2}], "set"),
        (np.array([object()]), None),
    ],
)
def test_what_would_need_pickle_is_one_error_naming_its_type(
    value: object, named: str | None
) -> None:
    with pytest.raises(UnencodableValue) as refused:
        encode(value)
    if named is None:
        assert str(refused.value).startswith("a NumPy array of dtype object cannot be returned")
    else:
        assert str(refused.value).startswith(f"the return value holds a {named}, which cannot")
