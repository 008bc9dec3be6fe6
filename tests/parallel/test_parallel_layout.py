"""Layout: Megatron's rank order, coordinates, group membership."""

from __future__ import annotations

import itertools

import pytest

from ascend_patch.parallel import MEGATRON_GROUPS, Layout, ParallelConfigError


def test_worked_example_24_ranks_tp2_pp3_cp2_dp2():
    layout = Layout.from_world(24, tp=2, pp=3, cp=2)
    assert layout.dp == 2
    # rank = tp + 2*cp + 4*dp + 8*pp  (tp fastest, pp slowest)
    assert layout.coordinates(13) == {"tp": 1, "cp": 0, "ep": 0, "dp": 1, "pp": 1}
    assert layout.rank_of(tp=1, cp=1, dp=1, pp=2) == 23
    assert layout.groups("tp") == [[2 * i, 2 * i + 1] for i in range(12)]
    assert layout.groups("cp")[:4] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("dp")[:4] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("pp") == [[r, r + 8, r + 16] for r in range(8)]
    assert layout.groups("dp-cp")[:3] == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14]]
    assert layout.groups("tp-pp")[0] == [0, 1, 8, 9, 16, 17]
    assert layout.embedding_groups()[:2] == [[0, 16], [1, 17]]
    assert layout.group_of(13, "pp") == [5, 13, 21]
    table = layout.rank_table(nproc_per_node=8)
    assert (table[13].node, table[13].local_rank, table[13].dp, table[13].pp) == (1, 5, 1, 1)


def test_rank_coordinates_round_trip_for_every_order():
    for order, cp in (("tp-cp-ep-dp-pp", 2), ("tp-cp-ep-pp-dp", 1), ("tp-pp-dp", 1), ("cp-tp-dp-pp", 2)):
        layout = Layout(tp=2, pp=3, dp=2 * (3 - cp), cp=cp, order=order)
        seen = set()
        for rank in range(layout.world_size):
            coords = layout.coordinates(rank)
            assert layout.rank_of(**coords) == rank
            seen.add(tuple(coords[d] for d in ("tp", "cp", "dp", "pp")))
        assert len(seen) == layout.world_size == 24


def test_pp_before_dp_order():
    layout = Layout(tp=2, pp=3, dp=2, order="tp-cp-ep-pp-dp")
    # rank = tp + 2*pp + 6*dp
    assert layout.groups("pp")[:2] == [[0, 2, 4], [1, 3, 5]]
    assert layout.groups("dp")[:2] == [[0, 6], [1, 7]]


def test_expert_layout_carves_ep_out_of_dp_and_cp():
    layout = Layout.from_world(16, tp=2, pp=2, cp=2, ep=2)
    assert (layout.dp, layout.expert_dp) == (2, 2)
    # the expert layout is expert-TP x EP x expert-DP x PP = 2 x 2 x 2 x 2
    assert layout.groups("ep", "expert")[:2] == [[0, 2], [1, 3]]
    assert layout.groups("dp", "expert")[:2] == [[0, 4], [1, 5]]
    assert layout.groups("tp-ep", "expert")[0] == [0, 1, 2, 3]
    narrow = Layout.from_world(8, tp=2, ep=4, expert_tp=1)
    assert narrow.etp == 1 and narrow.expert_dp == 2
    assert narrow.groups("ep", "expert") == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_order_errors_name_the_problem():
    with pytest.raises(ParallelConfigError, match="leaves out pp but its size is 2; add pp"):
        Layout(tp=2, pp=2, order="tp-dp")
    with pytest.raises(ParallelConfigError, match="names xp; it may use only tp, cp, ep, dp, pp"):
        Layout(order="tp-xp-dp")
    with pytest.raises(ParallelConfigError) as info:
        Layout(order="tp-dp-tp")
    assert str(info.value) == ("rank order 'tp-dp-tp' repeats tp; name each dimension once, e.g. 'tp-dp' "
                               "(megatron-core's default is 'tp-cp-ep-dp-pp')")
    with pytest.raises(ParallelConfigError) as info:
        Layout(tp=2, expert_tp=0)
    assert str(info.value) == ("expert TP must be a positive integer, got 0; use --expert-tensor-parallel-size "
                               "1 or more (1 means no expert-tensor parallelism)")
    with pytest.raises(ParallelConfigError, match=r"expert layout's DP \(1 = world / \(expert-TP x EP x PP\)\) "
                                                  r"must equal the dense DP \(2\)"):
        Layout(tp=1, pp=2, dp=2, ep=2, order="tp-cp-ep-pp-dp")
    with pytest.raises(ParallelConfigError, match="even without experts"):
        Layout(tp=2, pp=2, dp=1, cp=2, order="tp-cp-ep-pp-dp")


def test_groups_equal_megatron_rank_generator_for_many_layouts():
    # megatron-core's RankGenerator is pure Python: compare every group it would build
    from megatron.core.parallel_state import RankGenerator

    compared = 0
    for world, tp, pp, cp, ep, etp in itertools.product((4, 8, 12, 16), (1, 2, 4), (1, 2, 3), (1, 2),
                                                       (1, 2, 4), (None, 1)):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        e_tp = tp if etp is None else etp
        if world % (e_tp * ep * pp):
            continue
        for order in ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"):
            try:
                layout = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, expert_tp=etp, order=order)
            except ParallelConfigError:
                continue  # megatron asserts the same (pp not last with unequal expert DP)
            dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
            expert = RankGenerator(tp=e_tp, ep=ep, dp=world // (e_tp * ep * pp), pp=pp, cp=1, order=order)
            for name, (kind, dims) in MEGATRON_GROUPS.items():
                expected = (dense if kind == "dense" else expert).get_ranks(dims)
                assert layout.groups(dims, kind) == expected, (world, tp, pp, cp, ep, etp, order, name)
                compared += 1
    assert compared == 395 * len(MEGATRON_GROUPS)  # every layout of the grid that megatron accepts
