"""The metadata's pickle writer: what it writes loads as what the standard pickler's output loads as."""

from __future__ import annotations

import collections
import pickle

import pytest

from ascend_patch.loaders.pickle_write import GlobalCall, dumps
from ascend_patch.loaders.torch_zip import TorchGlobal

INTS = [0, 1, 255, 256, 65535, 65536, -1, -129, 2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**64 + 7, -(2**70)]


@pytest.mark.parametrize("value", [
    None, True, False, "", "decoder.layers.mlp.experts.experts.linear_fc1.weight", "ü\u4e2d\U0001f600",
    (), (1,), [], [1, "a", None], {}, {"k": (1, 2, [3, {"x": None}])}, INTS, tuple(INTS),
])
def test_plain_data_loads_as_the_standard_picklers_does(value):
    got = pickle.loads(dumps(value))
    assert got == value and type(got) is type(value)
    if isinstance(value, (list, tuple)):
        assert [type(x) for x in got] == [type(x) for x in value]


def test_calls_and_globals_are_named_not_imported():
    call = GlobalCall("collections", "OrderedDict", [("b", 2), ("a", GlobalCall("builtins", "frozenset", (1, 2)))])
    got = pickle.loads(dumps({"od": call, "fn": TorchGlobal("collections", "namedtuple")}))
    assert got == {"od": collections.OrderedDict([("b", 2), ("a", frozenset({1, 2}))]),
                   "fn": collections.namedtuple}
    assert type(got["od"]) is collections.OrderedDict
    assert b"ccollections\nOrderedDict\n" in dumps(call)


def test_a_type_it_does_not_know_is_refused():
    with pytest.raises(TypeError, match="float"):
        dumps({"x": 1.5})
