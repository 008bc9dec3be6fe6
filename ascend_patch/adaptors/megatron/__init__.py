"""The Megatron adaptor: patches stock megatron-core needs to train on the npu and cpu targets.

Every patch here reaches into megatron-core internals, so each carries the version range
it was checked against (:mod:`.releases`); outside it the manager skips
the patch with that reason. All of them wait for megatron-core to be imported: nothing
here imports megatron at ``import ascend_patch`` time. The list with reasons is in
docs/megatron.md; :func:`ascend_patch.adaptors.megatron.plugin.megatron_patches` builds it.
"""

