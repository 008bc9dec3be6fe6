"""Run under torchrun + ``python -m ascend_patch --device cpu``: build megatron-core's groups, write them.

argv: OUTPUT_DIR LAYOUTS_JSON (a list of {"name", "tp", "pp", "cp", "ep", "etp", "order"}).
Each rank writes rank<r>.json: layout name -> parallel_state group name -> the ranks of its group.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    out_dir, layouts = sys.argv[1], json.loads(sys.argv[2])
    dist.init_process_group("nccl")  # stock code: ascend_patch maps it onto gloo
    from megatron.core import parallel_state as ps

    rank = dist.get_rank()
    config = os.path.join(out_dir, "nccl_comm.yaml")
    if rank == 0:
        with open(config, "w") as f:  # exercises torch.distributed.ProcessGroupNCCL.Options
            f.write("tp:\n  max_ctas: 4\n  cga_cluster_size: 2\ndp:\n  is_high_priority_stream: true\n")
    dist.barrier()
    getters = {
        "tensor_model_parallel": lambda: ps.get_tensor_model_parallel_group(),
        "pipeline_model_parallel": lambda: ps.get_pipeline_model_parallel_group(),
        "data_parallel": lambda: ps.get_data_parallel_group(),
        "data_parallel_with_cp": lambda: ps.get_data_parallel_group(with_context_parallel=True),
        "context_parallel": lambda: ps.get_context_parallel_group(),
        "model_parallel": lambda: ps.get_model_parallel_group(),
        "tensor_and_context_parallel": lambda: ps.get_tensor_and_context_parallel_group(),
        "tensor_and_data_parallel": lambda: ps.get_tensor_and_data_parallel_group(),
        "tensor_and_data_parallel_with_cp": lambda: ps.get_tensor_and_data_parallel_group(with_context_parallel=True),
        "expert_model_parallel": lambda: ps.get_expert_model_parallel_group(),
        "expert_tensor_parallel": lambda: ps.get_expert_tensor_parallel_group(),
        "expert_tensor_and_model_parallel": lambda: ps.get_expert_tensor_and_model_parallel_group(),
        "expert_tensor_model_pipeline_parallel": lambda: ps.get_expert_tensor_model_pipeline_parallel_group(),
        "expert_data_parallel": lambda: ps.get_expert_data_parallel_group(),
        "embedding": lambda: ps.get_embedding_group(check_initialized=False),
        "position_embedding": lambda: ps.get_position_embedding_group(check_initialized=False),
    }
    result = {}
    for spec in layouts:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=spec["tp"], pipeline_model_parallel_size=spec["pp"],
            context_parallel_size=spec["cp"], expert_model_parallel_size=spec["ep"],
            expert_tensor_parallel_size=spec["etp"], order=spec["order"],
            nccl_communicator_config_path=config, high_priority_stream_groups=["dp_cp"])
        groups = {}
        for name, get in getters.items():
            group = get()
            groups[name] = None if group is None else dist.get_process_group_ranks(group)
        tp_group, dp_gloo = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group_gloo()
        groups["_backend_names"] = [dist.get_backend(tp_group), dist.get_backend(dp_gloo)]
        x = torch.full((4,), float(rank), dtype=torch.bfloat16)
        dist.all_reduce(x, group=tp_group)
        groups["_tp_sum"] = x[0].item()
        groups["_coords"] = {"tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
                             "dp": ps.get_data_parallel_rank(), "cp": ps.get_context_parallel_rank(),
                             "ep": ps.get_expert_model_parallel_rank(),
                             "expert_dp": ps.get_expert_data_parallel_rank()}
        result[spec["name"]] = groups
        ps.destroy_model_parallel()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
