"""Collectives on the cpu target over gloo, at world sizes 2 and 4, against single-process references."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the spawned workers import comm_workers

import comm_workers  # noqa: E402

pytestmark = pytest.mark.slow


# What one patched spawn runs at each world size: the suites share its processes' start-up
SUITES_AT = {2: ("collectives", "dtypes", "mesh_and_fsdp"), 4: ("collectives", "dtypes")}


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """world -> (directory of the suites that passed, the spawn's error or None); one spawn per world size."""
    done = {}

    def get(world: int):
        if world not in done:
            out = tmp_path_factory.mktemp(f"world{world}")
            try:
                comm_workers.spawn(comm_workers.run_suites, world, list(SUITES_AT[world]), str(out))
                done[world] = (out, None)
            except Exception as exc:  # the failing rank's traceback: reported by the suites it stopped
                done[world] = (out, exc)
        return done[world]

    return get


def assert_passed(spawned, world: int, suite: str) -> None:
    out, error = spawned(world)
    assert (out / suite).exists(), f"suite {suite!r} at world {world} did not pass; the spawn failed with:\n{error}"


@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_form_matches_the_single_process_result(spawned, world):
    # all_reduce, all_gather_into_tensor (both output forms), reduce_scatter_tensor (both input forms),
    # all_to_all_single (even and uneven), broadcast, batch_isend_irecv, coalescing managers,
    # async handles, bf16/fp16/float8, PREMUL_SUM, subgroups: see comm_collective_checks.CHECKS
    assert_passed(spawned, world, "collectives")


@pytest.mark.parametrize("world", [2, 4])
def test_every_dtype_and_reduce_op_matches_the_single_process_result(spawned, world):
    # fp64, int8/32/64, uint8, bool, complex64 (and fp32/bf16/fp16): all_reduce and reduce with
    # SUM/MIN/MAX/PRODUCT/AVG, sync and async, coalesced, uneven reduce_scatter lists, data movers:
    # see comm_dtype_checks.CHECKS
    assert_passed(spawned, world, "dtypes")


@pytest.mark.parametrize("world", [2])
def test_plain_gloo_lacks_what_the_fallbacks_provide(world):
    # if torch's gloo gains one of these forms, this fails and the fallback can go
    comm_workers.spawn(comm_workers.gaps_unpatched, world)


def test_device_mesh_for_cuda_runs_dtensor_and_fsdp2_on_the_host(spawned):
    assert_passed(spawned, 2, "mesh_and_fsdp")
