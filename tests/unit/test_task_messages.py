"""What Spark's barrier tasks tell each other (engines/spark/gather.py): JSON on the way, values
on either side, and one clear error for a message of another shape."""

from __future__ import annotations

import pytest

from ember.engines.spark.gather import Ready, StoreAddress, all_gather


class Stage:
    """The allGather of a stage whose other tasks said `others`."""

    def __init__(self, *others: str) -> None:
        self.others = others

    def allGather(self, message: str) -> list[str]:
        return [message, *self.others]


def test_every_tasks_message_comes_back_as_a_value_in_rank_order() -> None:
    stage = Stage(Ready(7, "server 1 refused").encode(), Ready(9, None).encode())
    assert all_gather(stage, Ready(8, None)) == [
        Ready(8, None),
        Ready(7, "server 1 refused"),
        Ready(9, None),
    ]
    assert all_gather(Stage(), StoreAddress(port=7101)) == [StoreAddress(port=7101, error=None)]


@pytest.mark.parametrize("text", ['{"rows": 8}', '{"rows": 8, "unreachable": null, "x": 1}', "[]"])
def test_a_message_of_another_shape_is_one_error_naming_its_fields(text: str) -> None:
    with pytest.raises(ValueError, match=r"must hold \['rows', 'unreachable'\], got"):
        all_gather(Stage(text), Ready(8, None))
