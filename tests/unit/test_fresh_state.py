"""A model's own state as loaded, put back (loaders/fresh_state.py), on a small mlx module tree."""

import mlx.core as mx
import mlx.nn as nn

from loaders.fresh_state import FreshState


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2)
        self._delta = None  # a plain attribute, later an array entry (mlx keeps arrays as entries)
        self._seen = []  # a list the model appends to
        self._sizes = (4, 4)  # a tuple entry: no parameter type (Module.update would refuse it)
        self._count = 0


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = Head()
        self.scale = mx.array([2.0])
        object.__setattr__(self.head, "_parent", self)  # a reference up the tree stays that object


def test_restore_puts_back_what_the_model_set_on_itself_and_nothing_else():
    model = Model()
    fresh = FreshState(model)
    weight = model.head.proj.weight
    head = model.head
    head._delta = mx.array([3])
    head._seen.append("image")
    head._sizes = (8, 8)
    head._count = 5
    head._later = mx.array([1])  # a private entry the load did not have
    model.scale = mx.array([7.0])  # a parameter: the lane never touches those

    fresh.restore()

    assert head._delta is None and "_delta" not in head
    assert head._seen == [] and head._sizes == (4, 4) and head._count == 0
    assert "_later" not in head and not hasattr(head, "_later")
    assert head._parent is model and head.proj.weight is weight
    assert model.scale.item() == 7.0
    head._seen.append("again")  # the kept list is a copy: a second restore starts empty too
    fresh.restore()
    assert head._seen == []
