"""The Megatron-LM adaptor: patches Megatron-LM's own training entry point needs on npu and cpu.

Megatron-LM (``pretrain_gpt.py`` and ``megatron/training``) is not a pip distribution: it is
a checkout on ``PYTHONPATH`` that pairs with one megatron-core release (tag ``core_v0.16.x``
with megatron-core 0.16). Its patches therefore carry megatron-core's version range
(:mod:`ascend_patch.adaptors.megatron.releases`), checked against the installed wheel. All of them wait
for their module to be imported: nothing here imports Megatron at ``import ascend_patch``
time. :func:`ascend_patch.adaptors.megatron.training.plugin.training_patches` declares them
all, in one list.
"""

